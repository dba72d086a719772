"""The pytest internals the gate uses (pytest_redline/pytest_internals.py): each found on this
pytest, and each missing or changed one taking pytest's public path with one line saying so.

Internals that pytest's own runner calls are not deleted while pytest runs: the checker's
tests remove them inside ``monkeypatch.context()`` and restore them before the test ends; the
gate's runs replace them with wrappers of a changed signature that still work for pytest."""
from __future__ import annotations

import _pytest.config.findpaths as findpaths
import _pytest.runner as runner
import _pytest.unraisableexception as unraisable
import pytest
from redline_fakes import Project

from pytest_redline import protocol, pytest_internals

pytest_plugins = ["pytester"]

ALPHA = "--redline-alpha=0.1"
DETERMINE_SETUP = findpaths.determine_setup
VERDICT = "CERTIFIED (fake-grid, select): deploy fast (+100.0% tpf, -1.7 accuracy points)"


def _determine_setup_8_0(inifile, args, rootdir_cmd_arg=None, invocation_dir=None):
    """pytest 8.0's signature: positional-or-keyword, no override_ini."""
    return DETERMINE_SETUP(inifile=inifile, override_ini=None, args=args, rootdir_cmd_arg=rootdir_cmd_arg,
                                     invocation_dir=invocation_dir)


def _setup_with_another_signature(original):
    def setup(self, item, *more):
        return original(self, item)
    return setup


def _from_call_without_reraise(original):
    def from_call(cls, func, when, **kwargs):
        return original.__func__(cls, func, when, **kwargs)
    return classmethod(from_call)


def test_every_internal_found_on_this_pytest():
    internals = pytest_internals.check()
    assert internals.exit_collections_key is unraisable.gc_collect_iterations_key
    assert internals.short_protocol and internals.determine_setup is findpaths.determine_setup
    assert internals.fallbacks == () and internals.line() is None


@pytest.mark.parametrize(("owner", "name", "replacement", "fallback"), [
    (unraisable, "gc_collect_iterations_key", None, "gc_collect_iterations_key"),
    (unraisable, "gc_collect_iterations_key", "not a stash key", "gc_collect_iterations_key"),
    (runner.SetupState, "setup", None, "full run protocol"),
    (runner.SetupState, "teardown_exact", None, "full run protocol"),
    (runner.SetupState, "setup", lambda self, item, extra: None, "full run protocol"),
    (pytest.CallInfo, "from_call", classmethod(lambda cls, func, when: None), "full run protocol"),
    (findpaths, "determine_setup", None, "determine_setup"),
    (findpaths, "determine_setup", lambda *, inifile, args, invocation_dir, new_required: None, "determine_setup"),
], ids=["key-missing", "key-changed", "setup-missing", "teardown-missing", "setup-changed", "from_call-no-reraise",
        "determine_setup-missing", "determine_setup-new-parameter"])
def test_each_missing_or_changed_internal_falls_back(monkeypatch, owner, name, replacement, fallback):
    with monkeypatch.context() as patch:
        if replacement is None:
            patch.delattr(owner, name)
        else:
            patch.setattr(owner, name, replacement)
        internals = pytest_internals.check()
    assert len(internals.fallbacks) == 1 and fallback in internals.fallbacks[0]
    assert internals.line() == f"redline: pytest {pytest.__version__}: {internals.fallbacks[0]}"
    assert (internals.exit_collections_key is None) == (fallback == "gc_collect_iterations_key")
    assert internals.short_protocol == (fallback != "full run protocol")
    assert (internals.determine_setup is None) == (fallback == "determine_setup")


def test_determine_setup_of_pytest_8_0_called_by_keyword(monkeypatch, tmp_path):
    """pytest 8.0's positional parameters, without override_ini: kept, and given only its own names."""
    monkeypatch.setattr(findpaths, "determine_setup", _determine_setup_8_0)
    internals = pytest_internals.check()
    assert internals.fallbacks == () and internals.determine_setup is _determine_setup_8_0
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    rootdir = pytest_internals.call_determine_setup(
        internals.determine_setup, inifile=None, override_ini=["x=1"], args=[str(tmp_path)], rootdir_cmd_arg=None,
        invocation_dir=tmp_path)[0]
    assert rootdir == tmp_path


def _gate_twice(project: Project, monkeypatch) -> tuple[object, int]:
    """Fill the store, then rerun warm; the warm run's result and how many items took the short protocol."""
    settled = []
    original = protocol.run_settled
    monkeypatch.setattr(protocol, "run_settled", lambda *a: settled.append(1) or original(*a))
    project.grid()
    assert project.run(ALPHA).ret == 0
    return project.run(ALPHA), len(settled)


@pytest.mark.parametrize("missing", ["none", "exit-key", "setup-state", "from_call"])
@pytest.mark.slow  # two in-process pytester gate runs each: 0.5-0.7 s CPU, over the inner loop's budget
def test_gate_takes_the_public_path_without_an_internal(project_factory, monkeypatch, missing):
    """The same verdict, one start-up line, and no short protocol without its internals."""
    if missing == "exit-key":
        monkeypatch.setattr(unraisable, "gc_collect_iterations_key", object())  # pytester still sets it
    elif missing == "setup-state":
        monkeypatch.setattr(runner.SetupState, "setup", _setup_with_another_signature(runner.SetupState.setup))
    elif missing == "from_call":
        monkeypatch.setattr(pytest.CallInfo, "from_call", _from_call_without_reraise(pytest.CallInfo.from_call))
    result, settled = _gate_twice(project_factory(), monkeypatch)
    assert result.ret == 0
    result.stdout.fnmatch_lines([VERDICT])
    lines = [line for line in result.errlines if line.startswith("redline: pytest ")]
    if missing == "none":
        assert lines == [] and settled > 100
        return
    assert len(lines) == 1
    if missing == "exit-key":
        assert "gc_collect_iterations_key" in lines[0] and settled > 100
    else:
        assert "full run protocol" in lines[0] and settled == 0


@pytest.mark.slow  # in-process pytester gate runs: 0.4 s CPU, over the inner loop's budget
def test_spaced_path_option_refused_without_determine_setup(project_factory, monkeypatch):
    """Without determine_setup the gate cannot tell whether a spaced path moved the rootdir: it refuses it."""
    project = project_factory()
    project.grid()
    (project.path / "pytest.ini").write_text("[pytest]\n")
    assert project.run(ALPHA, "--redline-grid", "redline.yaml").ret == 0  # inside the rootdir: it did not move
    monkeypatch.delattr(findpaths, "determine_setup")  # pytest's config holds its own reference
    result = project.run(ALPHA, "--redline-grid", "redline.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "redline: pytest *: _pytest.config.findpaths.determine_setup is missing or changed, so a path option written "
        "with a space (--redline-grid PATH) is refused: write --redline-grid=PATH",
        "ERROR: --redline-grid redline.yaml: pytest fixes the rootdir before plugin options are known, so it also took "
        f"redline.yaml as a test path and the rootdir (now {project.path}) may have moved. Write "
        "--redline-grid=redline.yaml (with '=')"])
    assert project.run(ALPHA, "--redline-grid=redline.yaml").ret == 0


@pytest.fixture
def project_factory(pytester: pytest.Pytester):
    return lambda: Project(pytester)
