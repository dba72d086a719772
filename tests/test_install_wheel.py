"""The built wheel, installed for real, gates a grid beside a user project that has its own
top-level ``engines`` and ``suites`` packages: our import names cannot collide with theirs.

An editable install hides collisions (the repository is on sys.path), so this builds the wheel,
installs it with ``--no-deps`` into a venv made with ``--system-site-packages`` (torch and the
rest come from the running interpreter, and pip never reaches for a CUDA torch), and runs
``pytest --redline-alpha`` in a user folder.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{cmd} exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A venv's python with the wheel installed (the repository is not on its path)."""
    work = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
          "-w", str(work / "dist"), str(ROOT)], cwd=work)
    (wheel,) = (work / "dist").glob("pytest_redline-*.whl")
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(work / "venv")
    python = work / "venv" / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", str(wheel)], cwd=work)
    return python


def _user_project(folder: Path, model: Path) -> None:
    for package in ("engines", "suites"):  # the names that used to collide
        (folder / package).mkdir()
        (folder / package / "__init__.py").write_text("MINE = True\n")
        (folder / package / "arithmetic.py").write_text("raise ImportError('the user module was imported')\n")
    (folder / "redline.yaml").write_text(textwrap.dedent(f"""\
        name: user-project
        suite: arithmetic
        suite_args: {{split: calibration, n: 24, seed: 0}}
        engine: block_diffusion
        engine_args: {{model: {model}, threads: 1}}
        cost: tpf
        reference: acc95/semi90
        configs:
          acc95/semi90: {{accept_threshold: 0.95, semi_complete_threshold: 0.90}}
          again: {{accept_threshold: 0.95, semi_complete_threshold: 0.90}}
        deploy: fastest
        batch_size: 24
        """))
    (folder / "test_mine.py").write_text("from engines import MINE\nfrom suites import MINE as ALSO\n\ndef test_own():\n    assert MINE and ALSO\n")


def test_wheel_gates_beside_a_user_engines_and_suites_package(installed, tmp_path):
    site = _run([str(installed), "-c", "import pytest_redline.engines as e, pytest_redline.suites as s; "
                 "print(e.__file__); print(s.__file__)"], cwd=tmp_path).stdout.split()
    assert all(str(ROOT) not in path for path in site), site  # the wheel's copy, not the checkout
    model = Path(site[0]).parent / "models" / "bd-tiny"
    _user_project(tmp_path, model)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    report = tmp_path / "report.json"
    gate = _run([str(installed), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--redline-alpha=0.5",
                 f"--redline-report={report}", f"--redline-cache-dir={tmp_path / 'store'}"], cwd=tmp_path, env=env)
    data = json.loads(report.read_text())
    assert data["n"] == 24 and data["certified"] is True, gate.stdout[-2000:]
    own = _run([str(installed), "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_mine.py"], cwd=tmp_path, env=env)
    assert "1 passed" in own.stdout
