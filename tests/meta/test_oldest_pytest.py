"""The gate on the oldest pytest of pyproject's range (8.0), in a separate venv.

The venv holds pytest 8.0.x and its own dependencies, installed from the package index, and a
``.pth`` file that adds this interpreter's site folders after its own: numpy, scipy, the
project's editable install and the rest come from the running environment, pytest from the
venv. Each internal of pytest_redline/pytest_internals.py is exercised: the exit cleanup's key
(missing on 8.0: the start-up line says so), the setup state and ``CallInfo.from_call(reraise=)``
(a warm rerun takes the short protocol), ``determine_setup`` (8.0's positional signature, called
by keyword) and, for tests/conftest.py, ``_pytest.mark.expression``.
"""
from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

import pytest
from redline_fakes import QUIET, Project

pytest_plugins = ["pytester"]

pytestmark = pytest.mark.slow  # a venv and pytest 8.0 from the package index, then subprocess gates: ~15 s

ROOT = Path(__file__).resolve().parents[2]
ALPHA = "--redline-alpha=0.1"
VERDICT = "CERTIFIED (fake-grid, select): deploy fast (+100.0% tpf, -1.7 accuracy points)"
# Counts the items that take the short protocol; it implements no phase hook, so it keeps it.
PROBE = '''
import pytest_redline.protocol as protocol

settled = []
_run_settled = protocol.run_settled
protocol.run_settled = lambda *args: settled.append(1) or _run_settled(*args)

def pytest_unconfigure(config):
    print("SHORT PROTOCOL", len(settled))
'''
MODULE = '''
import pytest

@pytest.fixture(scope="module")
def resource():
    with open("events.txt", "a") as f:
        f.write("{name} up\\n")
    yield
    with open("events.txt", "a") as f:
        f.write("{name} down\\n")

def test_it(resource):
    pass
'''


@pytest.fixture(scope="module")
def oldest_python(tmp_path_factory) -> Path:
    """A venv's python with pytest 8.0.x, the running environment's packages behind it."""
    venv = tmp_path_factory.mktemp("pytest-8.0") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "pytest==8.0.*"],
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]
    own = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    outer = [p for p in site.getsitepackages() + [site.getusersitepackages()] if Path(p).is_dir()]
    (Path(own) / "_outer_environment.pth").write_text("".join(f"import site; site.addsitedir({p!r})\n" for p in outer))
    return python


def _version(python: Path, code: str) -> str:
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout.strip()


def test_gate_on_pytest_8_0(oldest_python: Path, pytester: pytest.Pytester):
    version, plugin = _version(oldest_python, "import pytest, pytest_redline; print(pytest.__version__, pytest_redline.__file__)").split()
    assert version.startswith("8.0.") and Path(plugin).is_relative_to(ROOT)
    project = Project(pytester)
    project.grid()
    (project.path / "pytest.ini").write_text("[pytest]\n")
    pytester.makepyfile(probe=PROBE, test_a=MODULE.format(name="a"), test_b=MODULE.format(name="b"))

    def gate(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(oldest_python), "-m", "pytest", *QUIET, *args], cwd=project.path, env=project.env(),
                              capture_output=True, text=True, timeout=300)

    cold = gate(ALPHA)
    assert cold.returncode == 0, cold.stdout[-3000:] + cold.stderr[-3000:]
    assert VERDICT in cold.stdout
    # The one internal 8.0 lacks, said once; everything else is used.
    assert [line for line in cold.stderr.splitlines() if line.startswith("redline:")] == [
        f"redline: pytest {version}: no _pytest.unraisableexception.gc_collect_iterations_key, so the exit cleanup "
        "collects garbage pytest's own number of times"]

    # The setup state and CallInfo.from_call(reraise=): a warm rerun between two test modules
    # takes the short protocol, and the modules' fixtures still end and start around the grid.
    warm = gate(ALPHA, "-p", "probe", "test_a.py", "redline.yaml", "test_b.py")
    assert warm.returncode == 0, warm.stdout[-3000:] + warm.stderr[-3000:]
    assert VERDICT in warm.stdout and "125 passed" in warm.stdout
    assert int(warm.stdout.split("SHORT PROTOCOL ")[1].split()[0]) > 100
    assert (project.path / "events.txt").read_text().splitlines() == ["a up", "a down", "b up", "b down"]

    # determine_setup, 8.0's positional signature called by keyword: a spaced path inside the
    # rootdir is accepted, one that moved the rootdir is refused with the rootdir it would be.
    assert gate(ALPHA, "--redline-grid", "redline.yaml").returncode == 0
    outside = project.path.parent / f"outside-{project.path.name}"
    outside.mkdir()
    (outside / "grid.yaml").write_text((project.path / "redline.yaml").read_text())
    moved = gate(ALPHA, "--redline-grid", str(outside / "grid.yaml"))
    assert moved.returncode == pytest.ExitCode.USAGE_ERROR
    assert f"without it the rootdir is {project.path}. Write --redline-grid={outside / 'grid.yaml'}" in moved.stderr


def test_slow_deselection_on_pytest_8_0(oldest_python: Path):
    """tests/conftest.py's use of _pytest.mark.expression (which -m 'not slow' skips importing by)."""
    code = ("import runpy; ns = runpy.run_path('tests/conftest.py'); d = ns['_deselects_slow']; "
            "print(d('not slow'), d('slow'), d('not slow and not gpu'), ns['_mark_expression_compiler']() is not None)")
    run = subprocess.run([str(oldest_python), "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env={**os.environ, "PYTHONPATH": ""})
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["True", "False", "True", "True"]
