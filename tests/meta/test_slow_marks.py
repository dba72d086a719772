"""The slow-mark check (tests/conftest.py): every run ends with a list of the tests not marked
``slow`` that took over the limit, setup and teardown included, so that ``pytest -m "not slow"``
stays the fast inner loop."""
import importlib.util
from pathlib import Path

pytest_plugins = ["pytester"]


def test_lists_each_unmarked_test_over_the_limit(pytester):
    conftest = Path(__file__).resolve().parents[1] / "conftest.py"
    pytester.makeconftest(f"""
import importlib.util
spec = importlib.util.spec_from_file_location("tests_conftest", {str(conftest)!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
module.SLOW_S = 0.2
pytest_terminal_summary = module.pytest_terminal_summary
""")
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    pytester.makepyfile("""
import time
import pytest

@pytest.fixture
def slow_setup():
    time.sleep(0.3)

def test_slow_in_setup(slow_setup):
    pass

def test_slow_call():
    time.sleep(0.3)

@pytest.mark.slow
def test_marked():
    time.sleep(0.3)

def test_fast():
    pass
""")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*2 tests not marked slow took over 0.2 s*", "*s  test_lists_each*::test_slow_*", "*s  test_lists_each*::test_slow_*"])
    listed = result.stdout.str().split("not marked slow took over", 1)[1]
    assert "test_marked" not in listed and "test_fast" not in listed
    assert "took over" not in pytester.runpytest("-p", "no:cacheprovider", "-k", "test_fast or test_marked").stdout.str()


def test_leaves_out_items_that_are_not_in_a_test_file():
    spec = importlib.util.spec_from_file_location("tests_conftest", Path(__file__).resolve().parents[1] / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)

    class Report:
        when, duration, keywords = "call", 60.0, {}

        def __init__(self, nodeid):
            self.nodeid = nodeid

    class Reporter:
        stats = {"passed": [Report("::acc95/semi90::arithmetic/cal/0"), Report("tests/test_x.py::test_y")]}
        lines: list[str] = []

        def write_sep(self, sep, title):
            self.lines.append(title)

        def write_line(self, line):
            self.lines.append(line)

    reporter = Reporter()
    conftest.pytest_terminal_summary(reporter)
    assert reporter.lines[1:] == ["   60.0 s  tests/test_x.py::test_y"]  # a gate's item is not a test


def test_a_module_marked_slow_as_a_whole_is_not_imported_when_slow_is_deselected(pytester):
    conftest = Path(__file__).resolve().parents[1] / "conftest.py"
    pytester.makeconftest(f"""
import importlib.util
spec = importlib.util.spec_from_file_location("tests_conftest", {str(conftest)!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
pytest_ignore_collect = module.pytest_ignore_collect
""")
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    pytester.makepyfile(
        test_whole="import pytest\nraise RuntimeError('imported')\npytestmark = pytest.mark.slow  # why\n"
                   "def test_a():\n    pass\n",
        test_some="import pytest\n@pytest.mark.slow\ndef test_marked():\n    pass\ndef test_fast():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "-m", "not (slow or other)")
    result.assert_outcomes(passed=1, deselected=1)  # test_whole.py was not imported: no error
    for keeping in ((), ("-m", "slow or not slow")):
        result = pytester.runpytest("-p", "no:cacheprovider", *keeping)
        assert "RuntimeError: imported" in result.stdout.str(), keeping  # imported, as pytest always does
