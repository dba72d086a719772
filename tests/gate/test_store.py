"""The outcome store: round trips, keys, leases, concurrent writers, and refusing bad files."""
from __future__ import annotations

import hashlib
import multiprocessing
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pytest_redline.decode.store import FILENAME, OutcomeStore, StoredOutcome, StoreError, content_key

pytest_plugins = ["pytester"]

numbers = st.one_of(st.none(), st.floats(min_value=0, max_value=1e9, allow_nan=False))
outcomes = st.builds(
    StoredOutcome,
    correct=st.booleans(),
    tokens=numbers,
    forwards=numbers,
    extra=st.dictionaries(st.text(min_size=1, max_size=8), st.floats(allow_nan=False, allow_infinity=False), max_size=3),
    text=st.text(max_size=200),
    session=st.text(max_size=8),
)


@pytest.fixture
def store(tmp_path: Path):
    s = OutcomeStore.open(tmp_path / ".redline")
    yield s
    s.close()


@settings(max_examples=40, deadline=None)
@given(outcome=outcomes)
@example(outcome=StoredOutcome(True, None, None, {}, "", ""))
@example(outcome=StoredOutcome(False, 0.0, 0.0, {"memory_gb": 4.015}, "λ ∑ \x00 multi\nline", "s"))
def test_roundtrip_outcome_store(tmp_path_factory: pytest.TempPathFactory, outcome: StoredOutcome) -> None:
    folder = tmp_path_factory.mktemp("store")
    with_store = OutcomeStore.open(folder)
    with_store.put("k", outcome, grid="g", config="c", prompt="p")
    with_store.close()
    reopened = OutcomeStore.open(folder)  # committed: visible from a new connection
    assert reopened.get(["k", "absent"]) == {"k": outcome}
    reopened.close()


def test_idempotent_put_keeps_first(store: OutcomeStore) -> None:
    first, second = StoredOutcome(True, 1, 1, {}, "a", "s1"), StoredOutcome(False, 2, 2, {}, "b", "s2")
    store.put("k", first)
    store.put("k", second)
    assert store.get(["k"]) == {"k": first}
    assert store.count() == 1


def test_get_many_keys(store: OutcomeStore) -> None:
    for i in range(1200):  # more than one IN (...) chunk
        store.put(f"k{i}", StoredOutcome(i % 2 == 0, i, 1))
    found = store.get([f"k{i}" for i in range(0, 1300, 3)])
    assert len(found) == 400
    assert found["k999"] == StoredOutcome(False, 999.0, 1.0)


@given(st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=6))
def test_content_key_ignores_key_order(parts: dict) -> None:
    assert content_key(parts) == content_key(dict(reversed(list(parts.items()))))


@given(st.dictionaries(st.text(max_size=5), st.integers(), min_size=1, max_size=6), st.data())
def test_content_key_changes_with_any_part(parts: dict, data: st.DataObject) -> None:
    key = data.draw(st.sampled_from(sorted(parts)))
    changed = {**parts, key: parts[key] + 1}
    assert content_key(changed) != content_key(parts)


def test_folder_created_with_gitignore(tmp_path: Path) -> None:
    OutcomeStore.open(tmp_path / "deep" / ".redline").close()
    assert (tmp_path / "deep" / ".redline" / ".gitignore").read_text().endswith("*\n")
    assert not [p for p in (tmp_path / "deep").iterdir() if p.name != ".redline"]  # no temporary folder left


def test_wal_journal(store: OutcomeStore) -> None:
    con = sqlite3.connect(store.path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    con.close()


# --------------------------------------------------------------------------- leases


def test_lease_excludes_other_live_owner(store: OutcomeStore, tmp_path: Path) -> None:
    assert store.take_lease("batch")
    assert store.take_lease("batch")  # the holder may take it again
    other = OutcomeStore(store.path)
    other.owner = "elsewhere:1"
    try:
        with sqlite3.connect(store.path) as con:  # make the holder another live process: our parent
            con.execute("UPDATE leases SET owner = 'parent', pid = ?", (os.getppid(),))
        assert not other.take_lease("batch")
        with sqlite3.connect(store.path) as con:
            con.execute("DELETE FROM leases")
        assert other.take_lease("batch")
        assert not store.take_lease("batch")  # held by `other`, a live process (this one)
    finally:
        other.close()


def test_lease_of_dead_process_is_taken_over(store: OutcomeStore) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # dead and reaped: its pid is free
    with sqlite3.connect(store.path) as con:
        con.execute("INSERT INTO leases VALUES ('batch', 'dead', ?, ?, 0)", (store.owner.split(":")[0], child.pid))
    assert store.take_lease("batch")


def test_lease_of_zombie_is_taken_over(store: OutcomeStore) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # until it exits, leaving it unreaped: a zombie
        assert Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        with sqlite3.connect(store.path) as con:
            con.execute("INSERT INTO leases VALUES ('batch', 'zombie', ?, ?, 0)", (store.owner.split(":")[0], child.pid))
        assert store.take_lease("batch")
    finally:
        child.wait()


def test_release_only_own_lease(store: OutcomeStore) -> None:
    store.take_lease("batch")
    other = OutcomeStore(store.path)
    other.owner = "elsewhere:1"
    other.release("batch")
    other.close()
    with sqlite3.connect(store.path) as con:
        assert con.execute("SELECT COUNT(*) FROM leases").fetchone()[0] == 1
    store.release("batch")
    with sqlite3.connect(store.path) as con:
        assert con.execute("SELECT COUNT(*) FROM leases").fetchone()[0] == 0


# --------------------------------------------------------------------------- concurrency


def _writer(folder: str, start: int) -> None:
    store = OutcomeStore.open(folder)
    for i in range(start, start + 150):
        store.put(f"k{i}", StoredOutcome(True, i, 1))
    store.close()


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    folder = str(tmp_path / ".redline")
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_writer, args=(folder, start)) for start in (0, 100, 200)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    store = OutcomeStore.open(folder)
    assert store.count() == 350  # 0..349, overlaps written once
    store.close()


OPENERS = """
import multiprocessing, sys, tempfile
from pytest_redline.decode.store import OutcomeStore, StoreError

def opener(folder, barrier):
    barrier.wait()
    try:
        OutcomeStore.open(folder).close()
    except StoreError as e:
        print("FAILED", e.__context__, flush=True)

if __name__ == "__main__":
    context = multiprocessing.get_context("fork")
    for trial in range(int(sys.argv[1])):
        folder, barrier = tempfile.mkdtemp(dir=sys.argv[2]) + "/.redline", context.Barrier(4)
        workers = [context.Process(target=opener, args=(folder, barrier)) for _ in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(60)
"""


@pytest.mark.slow  # 100 x 4 processes
def test_concurrent_openers_of_a_new_store_all_succeed(tmp_path: Path) -> None:
    """Four processes open one new store at once, 100 times (xdist workers do): none fails.
    Switching to WAL answered "database is locked" without waiting; 6 of 150 such trials failed."""
    script = tmp_path / "openers.py"
    script.write_text(OPENERS)
    run = subprocess.run([sys.executable, str(script), "100", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "FAILED" not in run.stdout, run.stdout[:2000]


# --------------------------------------------------------------------------- refusing bad files


def test_refuses_non_database(tmp_path: Path) -> None:
    (tmp_path / FILENAME).write_bytes(b"not sqlite" * 500)
    with pytest.raises(StoreError, match=rf"outcome store .*{FILENAME}: not a usable outcome store \(file is not a database\)"):
        OutcomeStore(tmp_path / FILENAME)


def test_refuses_foreign_database(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / FILENAME) as con:
        con.execute("CREATE TABLE notes (x)")
    with pytest.raises(StoreError, match=r"a foreign SQLite database \(tables: notes\), not ours"):
        OutcomeStore(tmp_path / FILENAME)


def test_refuses_other_schema_versions(tmp_path: Path) -> None:
    OutcomeStore(tmp_path / FILENAME).close()
    with sqlite3.connect(tmp_path / FILENAME) as con:
        con.execute("UPDATE redline_schema SET version = 0")
    with pytest.raises(StoreError, match=r"written by an older pytest-redline \(schema 0, this one reads 2\)"):
        OutcomeStore(tmp_path / FILENAME)


def test_refuses_damaged_schema(tmp_path: Path) -> None:
    OutcomeStore(tmp_path / FILENAME).close()
    with sqlite3.connect(tmp_path / FILENAME) as con:
        con.execute("DROP TABLE leases")
    with pytest.raises(StoreError, match="damaged: tables leases are missing"):
        OutcomeStore(tmp_path / FILENAME)


def test_scorer_name_is_unchanged_by_the_package_rename():
    """engines/ and suites/ install as pytest_redline.engines / pytest_redline.suites; the older
    key formats and the scoring version still name the scorer as before the rename."""
    from types import SimpleNamespace

    from pytest_redline.keys import scorer_name
    from pytest_redline.suites.arithmetic import ArithmeticSuite

    assert scorer_name(SimpleNamespace(suite=ArithmeticSuite())) == "suites.arithmetic.ArithmeticSuite"


# ------------------------------------------------------------------ keys by identity (pytest_redline.keys)

MODEL = Path(__file__).resolve().parents[2] / "engines" / "models" / "bd-tiny"
REPLAY_CSV = Path(__file__).resolve().parents[1] / "data" / "store-pre25" / "replay.csv"


def test_a_model_folder_is_identified_by_its_config_and_weights(tmp_path: Path) -> None:
    from pytest_redline.content import content_identity

    one, two = tmp_path / "one", tmp_path / "elsewhere" / "two"
    shutil.copytree(MODEL, one)
    shutil.copytree(MODEL, two)
    identity = content_identity(one)
    assert identity.startswith("sha256:") and content_identity(two) == identity  # by content, not by place
    (two / "MODEL_CARD.md").write_text("another card")  # documentation: not part of the model
    assert content_identity(two) == identity
    (two / "tokenizer_config.json").write_text("{}")  # the tokenizer is
    assert content_identity(two) != identity
    weights = (one / "model.safetensors").read_bytes()
    (one / "model.safetensors").write_bytes(weights[:-1] + bytes([weights[-1] ^ 1]))  # one bit of the weights
    assert content_identity(one) != identity


def test_a_log_folder_is_identified_by_all_its_files(tmp_path: Path) -> None:
    from pytest_redline.content import content_identity

    logs = tmp_path / "logs"
    (logs / "run").mkdir(parents=True)
    (logs / "run" / "samples.jsonl").write_text('{"doc_id": 0}\n')
    (logs / "results.json").write_text("{}")
    identity = content_identity(logs)
    (logs / ".DS_Store").write_text("hidden")
    assert content_identity(logs) == identity
    (logs / "run" / "notes.txt").write_text("a new file")
    assert content_identity(logs) != identity
    assert content_identity(logs / "results.json") == "sha256:" + hashlib.sha256(b"{}").hexdigest()
    with pytest.raises(FileNotFoundError, match=r"missing: no such file or folder"):
        content_identity(tmp_path / "missing")


def test_content_hashes_are_cached_by_path_size_and_mtime(tmp_path: Path) -> None:
    """A warm rerun reads no weights: the second session hashes no file."""
    from pytest_redline.content import ContentHashes, content_identity

    model = tmp_path / "model"
    shutil.copytree(MODEL, model)
    cache = tmp_path / "content-hashes.json"
    first = ContentHashes(cache)
    identity = content_identity(model, first)
    assert first.hashed == len([p for p in model.iterdir() if p.suffix in (".json", ".safetensors")])
    warm = ContentHashes(cache)
    assert content_identity(model, warm) == identity and warm.hashed == 0
    weights = model / "model.safetensors"
    os.utime(weights, ns=(1, 1))  # same content, another mtime: read again, same identity
    again = ContentHashes(cache)
    assert content_identity(model, again) == identity and again.hashed == 1


def test_only_existing_absolute_input_paths_enter_by_content(tmp_path: Path) -> None:
    from pytest_redline.content import content_identity
    from pytest_redline.keys import by_content

    csv = tmp_path / "replay.csv"
    shutil.copy2(REPLAY_CSV, csv)
    value = {"outcomes": str(csv), "model": "Qwen/Qwen2.5-0.5B", "path": str(tmp_path / "gone"), "trace": str(csv),
             "nested": [{"data": csv}], "threads": 1}
    assert by_content(value) == {"outcomes": content_identity(csv), "model": "Qwen/Qwen2.5-0.5B",
                                 "path": str(tmp_path / "gone"), "trace": str(csv),
                                 "nested": [{"data": content_identity(csv)}], "threads": 1}


def _replay_keys(folder: Path, suite: object | None = None) -> tuple[list[str], list]:
    """The current and older keys of a replay config's first batch, its outcome file in ``folder``."""
    from types import SimpleNamespace

    from pytest_redline.contracts import Prompt
    from pytest_redline.decode.enginebook import EngineBook
    from pytest_redline.keys import OutcomeKeys

    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy2(REPLAY_CSV, folder / "replay.csv")
    grid = SimpleNamespace(suite="arithmetic" if suite else None, suite_args={"n": 8}, batch_size=2, engine_stops=True)
    cal = SimpleNamespace(suite=suite, grid=grid, engines={"c": ("replay", {"outcomes": str(folder / "replay.csv")})},
                          params={"c": {"config": "acc95/semi90"}})
    prompts = [Prompt(id="p0", text="1+1"), Prompt(id="p1", text="2+2")]
    keys = OutcomeKeys(cal, EngineBook())
    return keys.current("c", prompts), keys.older("c", prompts)


class _Suite:
    version = "1"

    def score(self, prompt, text):
        return True


_Moved = type("_Suite", (_Suite,), {"__module__": "somewhere.else"})  # the same suite, its class moved


def test_keys_hold_inputs_by_content_and_the_suite_by_its_entry_point(tmp_path: Path) -> None:
    here, here_older = _replay_keys(tmp_path / "a", _Suite())
    there, there_older = _replay_keys(tmp_path / "b" / "c", _Moved())
    assert here == there  # another folder, another suite module: the same keys
    # replay is batch-invariant: its chain starts with the identity keys that held the batch
    assert here_older[0] == there_older[0] and not set(here) & set(here_older[0])
    assert here_older[1] != there_older[1]  # the place format held both
    assert len(set(here)) == 2 and not set(here) & set(here_older[1])
    assert _replay_keys(tmp_path / "d")[0] != here  # the suite is in the key


def test_the_key_holds_the_decode_format_not_the_package_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pytest_redline
    from pytest_redline import keys

    before = _replay_keys(tmp_path / "a")[0]
    monkeypatch.setattr(pytest_redline, "__version__", "99.0.0")
    assert _replay_keys(tmp_path / "b")[0] == before
    monkeypatch.setattr(keys, "DECODE_FORMAT", keys.DECODE_FORMAT + 1)
    assert _replay_keys(tmp_path / "c")[0] != before


# ------------------------------------------------------------------ warm reruns: the model-free engine identity

ENGINE_ARGS = {  # entry-point name -> engine_args with which each of our model engines is built cheaply
    "block_diffusion": {"device": "cpu", "dtype": "float32", "threads": 1},
    "flowblock": {"device": "cpu", "dtype": "float64", "threads": 1},
    "speculative": {"device": "auto", "threads": 1},
    "quantized": {"device": "cpu", "dtype": "float32", "threads": 1},
}


@pytest.mark.slow  # builds each model engine: imports transformers' model classes (~5 s of CPU)
@pytest.mark.parametrize("name", list(ENGINE_ARGS))
def test_model_free_identity_is_what_the_built_engine_reports(name: str, tmp_path: Path) -> None:
    import torch

    from pytest_redline import registry
    from pytest_redline.decode.enginebook import EngineBook, describe

    cls = registry.factory(registry.ENGINES, name)
    threads = torch.get_num_threads()
    try:
        engine = cls(**ENGINE_ARGS[name])
    finally:
        torch.set_num_threads(threads)
    model_free = cls.identity(ENGINE_ARGS[name], cache_dir=tmp_path)
    assert model_free == {"fingerprint": engine.fingerprint(), "runtime": engine.describe()}
    book = EngineBook(cache_dir=tmp_path)
    assert book.identity(name, ENGINE_ARGS[name])["runtime"] == describe(engine)
    assert book._engines == {}  # the identity built nothing
    assert (tmp_path / "weight-hashes.json").is_file()


def test_weight_hashes_are_cached_by_path_size_and_mtime(tmp_path: Path) -> None:
    from pytest_redline.engines.runtime import WeightHashes

    folder = tmp_path / "ckpt"
    folder.mkdir()
    weights = folder / "model.safetensors"
    weights.write_bytes(b"a" * 1000)
    cache = WeightHashes(tmp_path / "hashes.json")
    first = cache.sha256(folder)
    assert WeightHashes(tmp_path / "hashes.json")._entries[str(folder.resolve())]["sha256"] == first  # persisted
    os.utime(weights, ns=(1, 1))  # same content, another mtime: hashed again, same value
    assert WeightHashes(tmp_path / "hashes.json").sha256(folder) == first
    stat = weights.stat()
    weights.write_bytes(b"b" * 1000)  # same size and mtime, other content: the cache answers (its contract)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert WeightHashes(tmp_path / "hashes.json").sha256(folder) == first
    weights.write_bytes(b"b" * 1001)  # another size: hashed again
    assert WeightHashes(tmp_path / "hashes.json").sha256(folder) != first
    assert WeightHashes(None).sha256(folder) == WeightHashes(tmp_path / "hashes.json").sha256(folder)


@pytest.mark.slow  # its cold run decodes 32 prompts with two speculative models (torch and transformers)
def test_warm_rerun_builds_no_engine_and_decodes_nothing(pytester, run_gate, monkeypatch) -> None:
    """A cold run keys its outcomes by the model-free identity of the engine it built; the rerun
    finds every outcome under the same keys, so it builds no engine (no model loads)."""
    import json

    from tests.engines.test_speculative import GATE_GRID  # a speculative grid of 32 prompts, two configs

    from pytest_redline.engines import modeling
    from pytest_redline.engines.runtime import AR_DRAFT, AR_TARGET

    pytester.makefile(".yaml", warm=GATE_GRID.format(target=AR_TARGET, draft=AR_DRAFT))
    args = ("--redline-alpha=0.1", "--redline-grid", "warm.yaml", "--redline-cache-dir", "cache")
    cold = run_gate(*args, "--redline-report", "cold.json")
    assert cold.ret == 0
    stored = OutcomeStore.open(pytester.path / "cache")
    before = stored.count()
    loaded = []
    monkeypatch.setattr(modeling, "load", lambda *a, **k: loaded.append(a) or pytest.fail("a model was loaded"))
    warm = run_gate(*args, "--redline-report", "warm.json")
    assert warm.ret == 0 and loaded == []
    assert stored.count() == before > 0  # nothing decoded
    stored.close()
    def verdicts(name: str) -> list[dict]:  # everything but the decode time
        return [{k: v for k, v in c.items() if k != "decode_seconds"} for c in json.loads((pytester.path / name).read_text())["configs"]]

    assert verdicts("warm.json") == verdicts("cold.json")
