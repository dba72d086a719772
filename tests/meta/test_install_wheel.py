"""The built wheel, installed for real, gates a grid beside a user project that has its own
top-level ``engines`` and ``suites`` packages: our import names cannot collide with theirs.

An editable install hides collisions (the repository is on sys.path), so this builds the wheel,
installs it with ``--no-deps`` into a fresh venv and runs ``pytest --redline-alpha`` in a user
folder. The venv sees the running environment's third-party packages (torch and the rest, so pip
never reaches for a CUDA torch), wherever they are installed: in the running venv or in the
interpreter it was made from. It sees them through a view of each site directory (symlinks)
that leaves out this project's own install: the editable finder and its ``.pth``, the
repository path and the ``pytest_redline`` metadata. A ``.pth`` naming the running venv's site
directory would bring the editable install back, and a ``--system-site-packages`` venv sees the
base interpreter's packages, not the running venv's (a user's venv has torch, its base none).
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

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # a wheel build and subprocess gates


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{cmd} exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _site_dirs() -> list[Path]:
    """The running environment's site directories, in import order (a venv's own, then the base
    interpreter's when the venv sees them)."""
    dirs: list[Path] = []
    for entry in sys.path:
        path = Path(entry or ".").resolve()
        if path.name in ("site-packages", "dist-packages") and path.is_dir() and path not in dirs:
            dirs.append(path)
    return dirs


def _site_view(site: Path, view: Path) -> None:
    """``view``: symlinks to everything in ``site`` but this project's install; a ``.pth`` that
    names the repository is copied without those lines."""
    view.mkdir(parents=True)
    for entry in site.iterdir():
        name = entry.name.lower()
        if name.startswith(("__editable__", "pytest_redline", "pytest-redline")):
            continue
        if entry.suffix in (".pth", ".egg-link") and entry.is_file():
            lines = entry.read_text(errors="replace").splitlines(keepends=True)
            mine = [line for line in lines if str(ROOT) in line]
            if mine:
                if entry.suffix == ".pth":
                    (view / entry.name).write_text("".join(line for line in lines if line not in mine))
                continue
        (view / entry.name).symlink_to(entry)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A venv's python with the wheel installed, the running environment's third-party packages
    visible, and neither the repository nor its editable install on its path."""
    work = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
          "-w", str(work / "dist"), str(ROOT)], cwd=work)
    (wheel,) = (work / "dist").glob("pytest_redline-*.whl")
    venv.EnvBuilder(system_site_packages=False, with_pip=False).create(work / "venv")
    python = work / "venv" / "bin" / "python"
    views = [work / "sites" / str(i) for i, _ in enumerate(_site_dirs())]
    for site, view in zip(_site_dirs(), views):
        _site_view(site, view)
    (own_site,) = (work / "venv" / "lib").glob("python*/site-packages")
    # after the venv's own site-packages (the wheel), as a system site directory would come
    (own_site / "running-environment.pth").write_text(
        "import site; " + "; ".join(f"site.addsitedir({str(view)!r})" for view in views) + "\n")
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


PROBE = """
import importlib.metadata, importlib.util, json, sys
import engines, pytest_redline
print(json.dumps({
    "pytest_redline": pytest_redline.__file__, "engines": engines.__file__, "torch": bool(importlib.util.find_spec("torch")),
    "dists": [str(d.locate_file("")) for d in importlib.metadata.distributions() if d.metadata["Name"] == "pytest-redline"],
    "path": sys.path, "finders": [type(f).__module__ for f in sys.meta_path]}))
"""


def test_wheel_gates_beside_a_user_engines_and_suites_package(installed, tmp_path):
    venv_root = installed.parent.parent
    site = _run([str(installed), "-c", "import pytest_redline.engines as e, pytest_redline.suites as s; "
                 "print(e.__file__); print(s.__file__)"], cwd=tmp_path).stdout.split()
    assert all(Path(path).is_relative_to(venv_root) for path in site), site  # the wheel's copy, not the checkout
    model = Path(site[0]).parent / "models" / "bd-tiny"
    _user_project(tmp_path, model)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    seen = json.loads(_run([str(installed), "-c", PROBE], cwd=tmp_path, env=env).stdout)
    assert Path(seen["pytest_redline"]).is_relative_to(venv_root), seen["pytest_redline"]
    assert Path(seen["engines"]) == tmp_path / "engines" / "__init__.py"  # the user's own package
    assert seen["torch"], "the running environment's torch is not visible in the wheel's venv"
    assert [Path(d).resolve() for d in seen["dists"]] == [Path(seen["pytest_redline"]).parent.parent.resolve()]
    assert not [p for p in seen["path"] if p and Path(p).resolve().is_relative_to(ROOT)], seen["path"]
    assert not [f for f in seen["finders"] if "editable" in f], seen["finders"]
    report = tmp_path / "report.json"
    gate = _run([str(installed), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--redline-alpha=0.5",
                 f"--redline-report={report}", f"--redline-cache-dir={tmp_path / 'store'}"], cwd=tmp_path, env=env)
    data = json.loads(report.read_text())
    assert data["n"] == 24 and data["certified"] is True, gate.stdout[-2000:]
    own = _run([str(installed), "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_mine.py"], cwd=tmp_path, env=env)
    assert "1 passed" in own.stdout
