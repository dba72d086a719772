"""Shared test fixtures: the tiny random block-diffusion model, and an in-process gate run.

The Hypothesis profiles (``dev``, and ``ci`` when the CI environment variable is set) are
registered in the repository's root ``conftest.py``.
"""
import ast
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    """A tiny random block-diffusion Llama with the character tokenizer, saved as a model folder.

    Its weights are large (std 0.4), so that predictions depend on the input, confidences spread
    over (0, 1) and steps commit several tokens: for exact equivalence tests of the engines, in
    float64. torch is imported here, not at the top: statistics tests run without it.
    """
    import torch

    from training.model import ModelConfig, build_model
    from training.tokenizer import build_tokenizer

    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    model = build_model(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tokenizer)
    with torch.no_grad():
        for weight in model.parameters():
            if weight.dim() == 2:
                torch.nn.init.normal_(weight, std=0.4)
    folder = tmp_path_factory.mktemp("tiny-bd")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def run_gate(pytester):
    """``run_gate(*args)``: ``pytester.runpytest("-p", "no:cacheprovider", *args)`` in process, then
    torch's thread count restored (a grid's ``threads: 1`` is process-wide)."""
    import torch

    def run(*args):
        threads = torch.get_num_threads()
        try:
            return pytester.runpytest("-p", "no:cacheprovider", *args)
        finally:
            torch.set_num_threads(threads)

    return run


@pytest.hookimpl(trylast=True)  # after Hypothesis's own: it ends its initialization there
def pytest_sessionstart(session):
    """Hypothesis builds its Unicode table on the first text it draws, once per checkout (it keeps
    it in .hypothesis/unicode_data): about 6 s of CPU in a fresh clone, which would be charged to
    whichever test draws text first and make it look slow. Built here instead, with public API
    (not for a gate run: ``pytest --redline-alpha`` at the rootdir loads this file too)."""
    if session.config.getoption("redline_alpha", None) is not None:
        return
    from hypothesis import find, settings, strategies as st

    find(st.text(min_size=1), lambda text: True, settings=settings(database=None, max_examples=1))


SLOW_S = 5.0  # a test over this, setup and teardown included, is marked slow (pyproject's markers)


def pytest_terminal_summary(terminalreporter):
    """List, at the end of every run, each test not marked ``slow`` that took over SLOW_S seconds
    (setup, call and teardown together: what it costs the inner loop, ``pytest -m "not slow"``),
    so that the marks stay true. A gate's items (``pytest --redline-alpha`` at the rootdir loads this
    file too) are not tests and are left out."""
    took: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            test_file = report.nodeid.split("::")[0].endswith(".py") if hasattr(report, "nodeid") else False
            if test_file and getattr(report, "when", None) in ("setup", "call", "teardown") and "slow" not in report.keywords:
                took[report.nodeid] = took.get(report.nodeid, 0.0) + report.duration
    over = sorted(((seconds, nodeid) for nodeid, seconds in took.items() if seconds > SLOW_S), reverse=True)
    if over:
        terminalreporter.write_sep("-", f"{len(over)} tests not marked slow took over {SLOW_S:g} s: mark them @pytest.mark.slow")
        for seconds, nodeid in over:
            terminalreporter.write_line(f"{seconds:7.1f} s  {nodeid}")


def pytest_ignore_collect(collection_path: Path, config):
    """With ``slow`` deselected (``-m "not slow"``), a test module marked slow as a whole (a
    top-level ``pytestmark = pytest.mark.slow``) found in a folder is not imported at all: its
    items would all be deselected, and importing it loads torch or transformers for nothing.
    A file named on the command line is always imported (pytest asks no hook for it)."""
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    if not _deselects_slow(config.getoption("markexpr", "")):
        return None
    return True if _marked_slow_as_a_whole(collection_path) else None


def _deselects_slow(markexpr: str) -> bool:
    """Whether the ``-m`` expression deselects an item marked ``slow`` and nothing else. Without
    pytest's parser of ``-m`` (a private module) every test module is imported, as pytest itself
    does, and a line says so."""
    if not markexpr:
        return False
    compile_expression = _mark_expression_compiler()
    if compile_expression is None:
        return False
    return not compile_expression(markexpr).evaluate(lambda name, **kwargs: name == "slow" and not kwargs)


_NO_COMPILER = []  # the line is written once


def _mark_expression_compiler():
    """``_pytest.mark.expression.Expression.compile`` (the parser behind -m itself), or None."""
    try:
        from _pytest.mark.expression import Expression

        return Expression.compile
    except (ImportError, AttributeError):
        if not _NO_COMPILER:
            _NO_COMPILER.append(True)
            sys.stderr.write("tests/conftest.py: this pytest has no _pytest.mark.expression.Expression.compile, so every "
                             "test module is imported under -m 'not slow'\n")
        return None


def _marked_slow_as_a_whole(path: Path) -> bool:
    for node in ast.parse(path.read_bytes(), filename=str(path)).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            return ast.unparse(node.value) == "pytest.mark.slow"
    return False
