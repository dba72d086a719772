"""One engine batch, run the way the gate charges it: Python's automatic garbage collection
paused (:func:`paused_gc`) and, when the grid sets ``timeout``, under that wall-clock limit
(:class:`BatchTimeout`, by SIGALRM in pytest's main thread)."""
from __future__ import annotations

import contextlib
import gc
import signal
import threading
from typing import Any, Mapping

from pytest_redline.contracts import Engine, Generation, Prompt


class BatchTimeout(Exception):
    """A batch ran past the grid key ``timeout``."""


class BatchRunner:
    """Calls ``engine.generate(prompts, params)`` for one batch: GC paused, within ``timeout``
    seconds (None: no limit)."""

    def __init__(self, timeout: float | None = None) -> None:
        self.timeout = timeout

    def generate(self, engine: Engine, prompts: list[Prompt], params: Mapping[str, Any]) -> list[Generation]:
        with paused_gc():
            return self._in_time(engine, prompts, params)

    def _in_time(self, engine: Engine, prompts: list[Prompt], params: Mapping[str, Any]) -> list[Generation]:
        timeout = self.timeout
        if timeout is None:
            return list(engine.generate(prompts, params))
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("the grid key timeout needs pytest's main thread (it uses SIGALRM)")

        def expire(signum, frame):
            raise BatchTimeout(f"timed out after {timeout:g} s (grid key timeout)")

        previous = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            return list(engine.generate(prompts, params))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def paused_gc():
    """Python's automatic garbage collection paused for one batch's decoding, then restored as
    it was. A full collection scans every object of the process, and a gate session holds
    hundreds of thousands (its items, reports, stored outcomes): one landing inside a decode
    loop costs as much as several forwards of a small model, time the engine would be charged
    for (``benchmarks/bench_overhead.py`` measures engines as the gate calls them, in this
    context). Nothing is lost: what a batch leaves for the collector is collected after it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
