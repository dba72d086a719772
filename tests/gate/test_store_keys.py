"""No outcome key changes: a store written by an older commit is reused in full, with no decode.

``tests/data/store-pre25/`` holds two grids and the outcome store that commit 6d5fd4b (the one
before issue 25) wrote for them, in one session (``written.json`` has the command): a replay grid
(96 of the paper's LLaDA2 math prompts at three configs) and a live grid (the embedded
block-diffusion model decoded for real on 64 arithmetic prompts at three operating points). Rerun
against a copy of that store, both must decode nothing: any change to what enters an outcome key
(engine identity, config parameters, suite, prompts, stop strings, batches, package version)
shows up here as decodes.

The key holds each grid's inputs by absolute path (the replay's outcome file, the model folder),
so the grids run from the folder they were written in, ``/tmp/pytest-redline-store-pre25``,
which this test fills with the committed grids and a copy of the embedded model. The live
grid's key also holds the torch and transformers versions, by design: with other versions it
cannot be reused, and only the replay grid is compared.
"""
import json
import os
import shutil
import sqlite3
import tempfile
from importlib.metadata import version
from pathlib import Path

import pytest

import pytest_redline.engines

DATA = Path(__file__).resolve().parents[1] / "data" / "store-pre25"
WRITTEN = json.loads((DATA / "written.json").read_text())
PLACE = Path("/tmp/pytest-redline-store-pre25")  # where the store was written (the key holds paths)
MODEL = Path(pytest_redline.engines.__file__).parent / "models" / "bd-tiny"

pytest_plugins = ["pytester"]


def _inputs() -> dict[str, Path]:
    files = {name: DATA / name for name in ("replay.yaml", "live.yaml", "replay.csv")}
    return files | {f"bd-tiny/{p.name}": p for p in MODEL.iterdir() if p.is_file()}


def _placed(inputs: dict[str, Path]) -> bool:
    if not PLACE.is_dir():
        return False
    there = {str(p.relative_to(PLACE)) for p in PLACE.rglob("*") if p.is_file()}
    return there == set(inputs) and all((PLACE / rel).read_bytes() == src.read_bytes() for rel, src in inputs.items())


def place_inputs() -> None:
    """Fill PLACE with the grids and the model, atomically (other sessions may run this test too)."""
    inputs = _inputs()
    if _placed(inputs):
        return
    staging = Path(tempfile.mkdtemp(prefix=PLACE.name + ".", dir=PLACE.parent))
    (staging / "bd-tiny").mkdir()
    for rel, src in inputs.items():
        shutil.copy2(src, staging / rel)
    shutil.rmtree(PLACE, ignore_errors=True)
    try:
        os.rename(staging, PLACE)
    except OSError:  # another session placed it first
        shutil.rmtree(staging, ignore_errors=True)
    assert _placed(inputs), f"{PLACE}: could not place the store's grids and model"


def test_a_store_written_before_issue_25_is_reused_without_decoding(run_gate, tmp_path):
    place_inputs()
    store = tmp_path / "store"
    store.mkdir()
    shutil.copy2(DATA / "outcomes.sqlite", store / "outcomes.sqlite")  # never the committed file: SQLite writes beside it
    with sqlite3.connect(store / "outcomes.sqlite") as db:
        stored = db.execute("SELECT COUNT(*) FROM outcomes").fetchone()[0]
    report = tmp_path / "report.json"
    result = run_gate("--redline-alpha=0.1", f"--redline-cache-dir={store}", f"--redline-report={report}",
                      f"--redline-grid={PLACE / 'replay.yaml'}", f"--redline-grid={PLACE / 'live.yaml'}")
    assert result.ret == 0, result.stdout.str()
    grids = {g["grid"]: g for g in json.loads(report.read_text())["grids"]}
    for name in WRITTEN["grids"]:
        assert grids[name]["outcomes"]["reused"] > 0, name  # the grid's items did run
    # The store was written with the seeded visiting order; the adaptive order visits the same
    # batches (same keys) in another order, so a candidate that stops early may need a batch the
    # seeded order never reached (batches of 16): that one alone is decoded, everything else reused.
    # The adaptive order may also stop a candidate sooner: then fewer outcomes are needed at all.
    replay = grids["store-replay"]
    assert replay["outcomes"]["decoded"] in (0, 16)
    assert replay["deployed"] == WRITTEN["grids"]["store-replay"]["deployed"]
    libraries = {name: version(name) for name in WRITTEN["libraries"]}
    if libraries != WRITTEN["libraries"]:
        pytest.skip(f"the live grid's key holds the library versions: written with {WRITTEN['libraries']}, "
                    f"running {libraries}; only the replay grid was compared")
    live = grids["store-live"]
    assert live["outcomes"]["decoded"] in (0, 16)
    with sqlite3.connect(store / "outcomes.sqlite") as db:  # what was decoded is new in the store: nothing was keyed anew
        added = db.execute("SELECT COUNT(*) FROM outcomes").fetchone()[0] - stored
    assert added == live["outcomes"]["decoded"] + replay["outcomes"]["decoded"]
    assert live["deployed"] == WRITTEN["grids"]["store-live"]["deployed"]
