"""The batch runner: one engine.generate call with the GC paused and under the grid's timeout."""
from __future__ import annotations

import gc
import signal
import threading
import time

import pytest

from pytest_redline.decode.batchrun import BatchRunner, BatchTimeout


class Engine:
    def __init__(self, sleep: float = 0.0) -> None:
        self.sleep, self.gc_on = sleep, []

    def generate(self, prompts, params):
        self.gc_on.append(gc.isenabled())
        time.sleep(self.sleep)
        return (f"{p}:{params['x']}" for p in prompts)  # any iterable: the runner makes it a list


def test_pauses_gc_for_the_batch_and_restores_it_generate():
    engine = Engine()
    assert BatchRunner().generate(engine, ["a", "b"], {"x": 1}) == ["a:1", "b:1"]
    assert engine.gc_on == [False] and gc.isenabled()
    gc.disable()
    try:
        BatchRunner(timeout=5.0).generate(engine, ["a"], {"x": 2})
        assert engine.gc_on == [False, False] and not gc.isenabled()  # left off, as it was
    finally:
        gc.enable()


def test_times_out_and_restores_the_alarm_generate():
    def previous(signum, frame):
        raise AssertionError("not called")

    old = signal.signal(signal.SIGALRM, previous)
    try:
        with pytest.raises(BatchTimeout, match=r"^timed out after 0.05 s \(grid key timeout\)$"):
            BatchRunner(timeout=0.05).generate(Engine(sleep=2.0), ["a"], {"x": 1})
        assert signal.getsignal(signal.SIGALRM) is previous and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        assert gc.isenabled()
    finally:
        signal.signal(signal.SIGALRM, old)


def test_timeout_needs_the_main_thread_generate():
    errors = []
    thread = threading.Thread(target=lambda: errors.append(_error(BatchRunner(timeout=1.0))))
    thread.start()
    thread.join()
    assert errors == ["the grid key timeout needs pytest's main thread (it uses SIGALRM)"]
    assert BatchRunner().generate(Engine(), ["a"], {"x": 3}) == ["a:3"]  # no timeout: any thread


def _error(runner: BatchRunner) -> str | None:
    try:
        runner.generate(Engine(), ["a"], {"x": 1})
    except RuntimeError as e:
        return str(e)
    return None
