"""The decoder, without pytest: batches in prompt order, only what is needed, each batch once."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import redline_fakes

from pytest_redline.calibration import Level, prepare
from pytest_redline.decode import DecodeError, Decoder
from pytest_redline.decode.enginebook import EngineBook
from pytest_redline.grid import parse_grid
from pytest_redline.decode.store import OutcomeStore

GRID = """\
suite: fake
suite_args: {n: 40}
engine: fake
engine_args: {log_path: calls.jsonl}
reference: ref
batch_size: 16
configs:
  ref: {forwards: 10}
  fast: {forwards: 5, wrong: [q3]}
"""


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    redline_fakes.install(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def decoder(folder: Path, text: str = GRID, session: str = "s1", store: OutcomeStore | None = None) -> Decoder:
    grid = parse_grid(text, folder / "redline.yaml")
    engines = EngineBook()
    cal = prepare(grid, "redline.yaml", Level(0.3, 0.1, 1, "holm", None), engines)
    return Decoder(cal, store or OutcomeStore.open(folder / ".redline"), engines, session)


def calls(folder: Path) -> list[tuple[int, list[str]]]:
    log = folder / "calls.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    return [(json.loads(line)["config"]["forwards"], json.loads(line)["prompts"]) for line in lines]


def ids(start: int, stop: int) -> list[str]:
    return [f"q{i}" for i in range(start, stop)]


def test_batches_in_prompt_order_with_fixed_size(folder: Path) -> None:
    d = decoder(folder)
    for i in range(40):
        d.need("fast", i)
    assert d.outcome("fast", 39).correct  # the first outcome asked of a config decodes all it needs
    assert calls(folder) == [(5, ids(0, 16)), (5, ids(16, 32)), (5, ids(32, 40))]
    assert not d.outcome("fast", 3).correct and d.outcome("ref", 3).correct
    assert calls(folder)[3:] == [(10, ids(0, 16)), (10, ids(16, 32)), (10, ids(32, 40))]


def test_need_limits_decoding_to_needed_batches(folder: Path) -> None:
    d = decoder(folder)
    d.need("fast", 20)
    d.outcome("ref", 20)
    d.outcome("fast", 20)
    assert calls(folder) == [(10, ids(16, 32)), (5, ids(16, 32))]  # the same batch as in a full run


def test_equivalent_stored_and_decoded_outcomes(folder: Path) -> None:
    first = decoder(folder, session="s1")
    fresh = [first.outcome(c, i) for c in ("ref", "fast") for i in range(40)]
    n_calls = len(calls(folder))
    second = decoder(folder, session="s2")
    stored = [second.outcome(c, i) for c in ("ref", "fast") for i in range(40)]
    assert len(calls(folder)) == n_calls  # nothing decoded again
    assert stored == fresh
    assert {o.session for o in stored} == {"s1"}


def test_store_key_separates_engine_arguments(folder: Path) -> None:
    decoder(folder).outcome("ref", 0)
    decoder(folder, GRID.replace("{log_path: calls.jsonl}", "{log_path: calls.jsonl, dtype: bfloat16}")).outcome("ref", 0)
    decoder(folder, GRID.replace("batch_size: 16", "batch_size: 8")).outcome("ref", 0)
    assert [len(prompts) for _, prompts in calls(folder)] == [16, 16, 8]


def test_scorer_crash_errors_only_its_prompt(folder: Path) -> None:
    d = decoder(folder, GRID.replace("{n: 40}", "{n: 40, crash_on: q3}"))
    assert d.outcome("ref", 2).correct
    with pytest.raises(DecodeError, match="scoring prompt 'q3' of config 'ref' failed: RuntimeError: fake scorer crashed on q3"):
        d.outcome("ref", 3)


def test_engine_build_failure_errors_every_prompt(folder: Path) -> None:
    d = decoder(folder, GRID.replace("{log_path: calls.jsonl}", "{log_path: calls.jsonl, colour: red}"))
    for i in (0, 39):
        with pytest.raises(DecodeError, match="engine 'fake' with engine_args .* failed to build: TypeError"):
            d.outcome("fast", i)


def test_batch_decoded_once_by_concurrent_decoders(folder: Path) -> None:
    text = GRID.replace("{log_path: calls.jsonl}", "{log_path: calls.jsonl, delay: 0.3}")
    results, errors = {}, []

    def run(name: str) -> None:
        try:
            store = OutcomeStore.open(folder / ".redline")
            store.owner = name  # two owners in one live process, as two xdist workers would be
            d = decoder(folder, text, session=name, store=store)
            d.need("fast", 0)
            results[name] = [d.outcome("ref", i).correct for i in range(16)]
            store.close()
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(name,)) for name in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert results["a"] == results["b"] == [True] * 16
    assert calls(folder) == [(10, ids(0, 16))]  # one decode of the reference's batch


def test_decoding_pauses_automatic_gc_and_restores_it(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine decodes a batch with Python's automatic collection paused, which is on again
    after the batch (and stays off after it where the caller had turned it off)."""
    import gc

    d = decoder(folder)
    engine = d.engines.get(*d.cal.engines["fast"])
    seen = []
    generate = engine.generate
    monkeypatch.setattr(engine, "generate", lambda prompts, config: seen.append(gc.isenabled()) or generate(prompts, config))
    assert gc.isenabled()
    d.need("fast", 0)
    d.outcome("fast", 0)
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        d.need("fast", 39)
        d.outcome("fast", 39)
        assert seen == [False, False] and not gc.isenabled()
    finally:
        gc.enable()
