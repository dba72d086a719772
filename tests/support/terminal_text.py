"""The gate's terminal summary as one line of text: its prose lines wrap at 120 columns
(pytest_redline.report.text.wrapped), so a test looks for a sentence in the words, whitespace
collapsed, not on one line."""


def flat(result) -> str:
    """A pytester result's stdout, its whitespace runs (line breaks included) collapsed to one space."""
    return " ".join(result.stdout.str().split())
