"""Stores stay warm: written by older key formats, or in another folder, they are reused with no decode.

Three committed stores, each holding a replay grid (96 of the paper's LLaDA2 math prompts at three
configs) and a live grid (the embedded block-diffusion model decoded for real on arithmetic
prompts), each written in one session (``written.json`` or ``README.md`` has the command):

- ``tests/data/store-pre25/``: written by commit 6d5fd4b (the one before issue 25), in the
  ``pre-stop`` key format of :data:`pytest_redline.keys.FORMATS`;
- ``tests/data/store-pre-identity/``: written by commit 2e7674c, in the ``place`` format;
- ``tests/data/store-identity/``: written in the current ``identity`` format.

The two older formats hold each grid's inputs by absolute path (the replay's outcome file, the
model folder), so their grids run from the folder they were written in, under ``/tmp``, which the
tests fill with the committed grids and a copy of the embedded model. The current format holds
inputs by content, so its grids run from any folder. A live grid's key also holds the torch and
transformers versions, by design: with other versions it cannot be reused, and only the replay
grid is compared.
"""
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

import pytest
import torch  # noqa: F401  imported before pytester's snapshot of sys.modules, which drops what a run imports after it:

import pytest_redline.engines
import pytest_redline.risk  # noqa: F401  scipy's and torch's extension modules cannot be imported twice
import pytest_redline.session  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
MODEL = Path(pytest_redline.engines.__file__).parent / "models" / "bd-tiny"
REPLAY_CSV = DATA / "store-pre25" / "replay.csv"

pytest_plugins = ["pytester"]


def _inputs(data: Path) -> dict[str, Path]:
    files = {name: data / name for name in ("replay.yaml", "live.yaml")} | {"replay.csv": REPLAY_CSV}
    return files | {f"bd-tiny/{p.name}": p for p in MODEL.iterdir() if p.is_file()}


def _placed(place: Path, inputs: dict[str, Path]) -> bool:
    if not place.is_dir():
        return False
    there = {str(p.relative_to(place)) for p in place.rglob("*") if p.is_file()}
    return there == set(inputs) and all((place / rel).read_bytes() == src.read_bytes() for rel, src in inputs.items())


def place_inputs(data: Path, place: Path) -> None:
    """Fill ``place`` with the grids of ``data`` and the model, atomically (other sessions may run this test too)."""
    inputs = _inputs(data)
    if _placed(place, inputs):
        return
    staging = Path(tempfile.mkdtemp(prefix=place.name + ".", dir=place.parent))
    (staging / "bd-tiny").mkdir()
    for rel, src in inputs.items():
        shutil.copy2(src, staging / rel)
    shutil.rmtree(place, ignore_errors=True)
    try:
        os.rename(staging, place)
    except OSError:  # another session placed it first
        shutil.rmtree(staging, ignore_errors=True)
    assert _placed(place, inputs), f"{place}: could not place the store's grids and model"


def rerun(run_gate, tmp_path: Path, data: Path, place: Path) -> tuple[dict, int, dict]:
    """Rerun both grids of ``data`` from ``place`` against a copy of its store: the report's grids,
    how many rows the store held, and how many rows it holds now per session (new or old)."""
    store = tmp_path / "store"
    store.mkdir()
    shutil.copy2(data / "outcomes.sqlite", store / "outcomes.sqlite")  # never the committed file: SQLite writes beside it
    with sqlite3.connect(store / "outcomes.sqlite") as db:
        stored = db.execute("SELECT COUNT(*) FROM outcomes").fetchone()[0]
        sessions = {row[0] for row in db.execute("SELECT DISTINCT session FROM outcomes")}
    report = tmp_path / "report.json"
    result = run_gate("--redline-alpha=0.1", f"--redline-cache-dir={store}", f"--redline-report={report}",
                      f"--redline-grid={place / 'replay.yaml'}", f"--redline-grid={place / 'live.yaml'}")
    assert result.ret == 0, result.stdout.str()
    with sqlite3.connect(store / "outcomes.sqlite") as db:
        rows = db.execute("SELECT session FROM outcomes").fetchall()
    counts = {"old": sum(r[0] in sessions for r in rows), "new": sum(r[0] not in sessions for r in rows)}
    return {g["grid"]: g for g in json.loads(report.read_text())["grids"]}, stored, counts


def libraries_differ(written: dict) -> str:
    libraries = {name: version(name) for name in written["libraries"]}
    if libraries == written["libraries"]:
        return ""
    return (f"the live grid's key holds the library versions: written with {written['libraries']}, "
            f"running {libraries}; only the replay grid was compared")


def test_a_store_written_before_issue_25_is_reused_without_decoding(run_gate, tmp_path):
    data, place = DATA / "store-pre25", Path("/tmp/pytest-redline-store-pre25")
    written = json.loads((data / "written.json").read_text())
    place_inputs(data, place)
    grids, stored, counts = rerun(run_gate, tmp_path, data, place)
    for name in written["grids"]:
        assert grids[name]["outcomes"]["reused"] > 0, name  # the grid's items did run
    # The store was written with the seeded visiting order; the adaptive order visits the same
    # batches (same keys) in another order, so a candidate that stops early may need a batch the
    # seeded order never reached (batches of 16): that one alone is decoded, everything else reused.
    # The adaptive order may also stop a candidate sooner: then fewer outcomes are needed at all.
    replay = grids["store-replay"]
    assert replay["outcomes"]["decoded"] in (0, 16)
    assert replay["deployed"] == written["grids"]["store-replay"]["deployed"]
    skip = libraries_differ(written)
    if skip:
        pytest.skip(skip)
    live = grids["store-live"]
    assert live["outcomes"]["decoded"] in (0, 16)
    # What was decoded is new in the store; the rest are the old rows, and their copies under the current keys.
    assert counts["new"] == live["outcomes"]["decoded"] + replay["outcomes"]["decoded"]
    assert counts["old"] > stored
    assert live["deployed"] == written["grids"]["store-live"]["deployed"]


def test_a_store_written_with_keys_by_place_is_reused_without_decoding(run_gate, tmp_path):
    """Written by 2e7674c, whose keys held inputs by path and the suite by its class."""
    data, place = DATA / "store-pre-identity", Path("/tmp/pytest-redline-store-pre-identity")
    written = json.loads((data / "written.json").read_text())
    place_inputs(data, place)
    grids, stored, counts = rerun(run_gate, tmp_path, data, place)
    replay = grids["store-replay"]
    assert replay["outcomes"] == {"reused": written["grids"]["store-replay"]["decoded"], "decoded": 0}
    assert replay["deployed"] == written["grids"]["store-replay"]["deployed"]
    skip = libraries_differ(written)
    if skip:
        pytest.skip(skip)
    live = grids["store-live"]
    assert live["outcomes"] == {"reused": written["grids"]["store-live"]["decoded"], "decoded": 0}
    assert live["deployed"] == written["grids"]["store-live"]["deployed"]
    assert counts == {"old": 2 * stored, "new": 0}  # each row copied once to its current key


def test_a_store_keyed_by_identity_is_reused_from_any_folder(run_gate, tmp_path):
    """The current format: the grids, the outcome file and the model in a folder of their own."""
    data = DATA / "store-identity"
    written = json.loads((data / "written.json").read_text())
    place = tmp_path / "elsewhere"
    place.mkdir()
    place_inputs(data, place / "inputs")
    grids, stored, counts = rerun(run_gate, tmp_path, data, place / "inputs")
    assert grids["store-replay"]["outcomes"] == {"reused": written["grids"]["store-replay"]["decoded"], "decoded": 0}
    skip = libraries_differ(written)
    if skip:
        pytest.skip(skip)
    assert grids["store-live"]["outcomes"] == {"reused": written["grids"]["store-live"]["decoded"], "decoded": 0}
    # replay is batch-invariant, so its keys hold no batch now: its outcomes are found under their
    # batched identity keys and copied once to their per-prompt keys; the live grid's are current
    copied = written["grids"]["store-replay"]["decoded"]
    assert counts == {"old": stored + copied, "new": 0}


CLONE_GRID = """\
name: clone
suite: arithmetic
suite_args: {split: calibration, n: 48, seed: 0}
engine: block_diffusion
engine_args: {device: cpu, dtype: float32, threads: 1}   # the embedded model: its path is the checkout's
cost: tpf
reference: acc95/semi90
configs:
  acc95/semi90: {accept_threshold: 0.95, semi_complete_threshold: 0.90}
  acc70/semi70: {accept_threshold: 0.70, semi_complete_threshold: 0.70}
deploy: fastest
delta: 0.10
batch_size: 16
"""


def clone_checkout(to: Path) -> Path:
    """A copy of the checkout's package in another folder, laid out as it installs (engines/ and
    suites/ inside pytest_redline/; copies, not links, so the embedded model's path is the copy's).
    Returns the folder to put first on PYTHONPATH."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    package = to / "pytest_redline"
    shutil.copytree(ROOT / "pytest_redline", package, ignore=ignore)
    for side in ("engines", "suites"):
        shutil.copytree(ROOT / side, package / side, ignore=ignore)
    return to


def gate(folder: Path, store: Path, env: dict | None = None) -> dict:
    folder.mkdir(exist_ok=True)
    (folder / "clone.yaml").write_text(CLONE_GRID)
    report = folder / "report.json"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--redline-alpha=0.1", f"--redline-cache-dir={store}",
         f"--redline-report={report}", f"--redline-grid={folder / 'clone.yaml'}"],
        cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(report.read_text())


@pytest.mark.slow  # a live grid decoded in a subprocess, then rerun from a copy of the checkout: 15.6 s of CPU measured
def test_a_rerun_from_a_copy_of_the_checkout_decodes_nothing(tmp_path):
    store = tmp_path / "store"
    first = gate(tmp_path / "here", store)
    assert first["outcomes"]["decoded"] > 0 and first["outcomes"]["reused"] == 0
    site = clone_checkout(tmp_path / "clone")
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run([sys.executable, "-c", "from pytest_redline.engines import runtime; print(runtime.EMBEDDED_MODEL)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert where == str(site / "pytest_redline" / "engines" / "models" / "bd-tiny")  # the copy's model, not ours
    second = gate(tmp_path / "clone-run", store, env)
    assert second["outcomes"] == {"reused": first["outcomes"]["decoded"], "decoded": 0}
    assert second["deployed"] == first["deployed"]
