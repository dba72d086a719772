"""The gate's terminal summary as one line of text: its prose lines wrap at 120 columns
(pytest_redline.report.text.wrapped), so a test looks for a sentence in the words, whitespace
collapsed, not on one line."""


def flat(result) -> str:
    """A pytester result's stdout, its whitespace runs (line breaks included) collapsed to one space."""
    return " ".join(result.stdout.str().split())


def summary_lines(result) -> list[str]:
    """The gate's terminal summary: pytest's header lines of a gate run (``redline: gating``,
    ``redline marks:`` and their continuations) and the lines from the first grid's ``redline:``
    section to the session's ``REDLINE`` line."""
    lines = result.outlines
    start = next(i for i, line in enumerate(lines) if line.startswith("=") and " redline: " in line)
    end = next(i for i, line in enumerate(lines) if line.startswith("=") and " REDLINE " in line)
    marks = next(i for i, line in enumerate(lines) if line.startswith("redline marks: "))
    after = marks + 1
    while lines[after].startswith("  "):  # the marks line's continuations
        after += 1
    return lines[marks - 1:after] + lines[start:end + 1]


def too_wide(result, width: int = 120) -> list[str]:
    """The summary's lines over ``width`` characters (none, in a gate run)."""
    return [line for line in summary_lines(result) if len(line) > width]
