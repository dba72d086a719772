"""Getting outcomes: from the store when it has them, else from the engine, in batches.

A :class:`Decoder` serves one grid in one process. It knows which (config, prompt)
outcomes the session needs (:meth:`Decoder.need`, from the selected items; the reference
is needed wherever a candidate is). The first time an outcome of a config is asked for,
it gets all that config's needed outcomes: batches of ``batch_size`` prompts in prompt
order (so a batch is always the same prompts, whatever was selected), each loaded from
the store or decoded by ``engine.generate(batch, params)``, scored by the suite unless the
engine set ``correct``, and committed to the store one outcome at a time.

Several processes (xdist workers) share the store: a process takes a lease on a batch
before decoding it, and waits for batches whose lease another live process holds. So each
batch, the reference's included, is decoded once.
"""
from __future__ import annotations

import math
import numbers
import signal
import threading
import time
import traceback
from typing import Any, Callable, Mapping, Sequence

from pytest_redline import __version__
from pytest_redline.calibration import Calibration
from pytest_redline.enginebook import EngineBook
from pytest_redline.store import OutcomeStore, StoredOutcome, content_key

PROGRESS_EVERY_S = 5.0  # at most this long without a progress line while decoding (plus one batch)


class DecodeError(Exception):
    """No outcome for a prompt: the engine raised or timed out, or the scorer crashed."""

    def __init__(self, message: str, details: str = "") -> None:
        super().__init__(message)
        self.message, self.details = message, details

    def explain(self, verbose: bool) -> str:
        return f"{self.message}\n{self.details}" if verbose and self.details else self.message


class BatchTimeout(Exception):
    pass


class Decoder:
    def __init__(
        self,
        cal: Calibration,
        store: OutcomeStore,
        engines: EngineBook,
        session: str,
        progress: Callable[[str], None] = lambda line: None,
        poll_s: float = 0.2,
    ) -> None:
        self.cal, self.store, self.engines, self.session = cal, store, engines, session
        self.progress, self.poll_s = progress, poll_s
        self.batch_size = cal.grid.batch_size
        self._needed: dict[str, set[int]] = {name: set() for name in cal.configs}
        self._outcomes: dict[str, dict[int, StoredOutcome]] = {name: {} for name in cal.configs}
        self._errors: dict[tuple[str, int], DecodeError] = {}
        self._config_errors: dict[str, DecodeError] = {}
        self._started: set[str] = set()

    # ------------------------------------------------------------------ public

    def need(self, config: str, index: int) -> None:
        """Plan: the session needs ``config``'s outcome on prompt ``index`` (and the reference's)."""
        self._needed[config].add(index)
        self._needed[self.cal.reference].add(index)

    def outcome(self, config: str, index: int) -> StoredOutcome:
        """The outcome of ``config`` on prompt ``index``; raises :class:`DecodeError`."""
        if config not in self._started:
            self._started.add(config)
            self._get(config, sorted({i // self.batch_size for i in self._needed[config]}))
        if index not in self._outcomes[config] and (config, index) not in self._errors:
            self._get(config, [index // self.batch_size])  # not planned (no collection hook ran)
        if config in self._config_errors:
            raise self._config_errors[config]
        if (config, index) in self._errors:
            raise self._errors[(config, index)]
        return self._outcomes[config][index]

    # ------------------------------------------------------------------ batches

    def _span(self, batch: int) -> range:
        return range(batch * self.batch_size, min(self.cal.n, (batch + 1) * self.batch_size))

    def _keys(self, config: str, batch: int) -> list[str]:
        prompts = [self.cal.prompts[i] for i in self._span(batch)]
        shared = {
            "engine": self.engines.identity(*self.cal.engines[config]),
            "params": self.cal.params[config],
            "suite": _suite_identity(self.cal),
            "batch": {"size": self.batch_size, "prompts": [p.id for p in prompts]},
            "package": __version__,
        }
        return [content_key({**shared, "prompt": _prompt_identity(p)}) for p in prompts]

    def _get(self, config: str, batches: Sequence[int]) -> None:
        if config in self._config_errors:
            return
        try:
            keys = {b: self._keys(config, b) for b in batches}
        except Exception as e:  # the engine failed to build, or its fingerprint raised
            self._config_errors[config] = DecodeError(f"config {config!r}: {e}", traceback.format_exc())
            return
        tracker = _Progress(self, config, sum(len(self._span(b)) for b in batches), len(batches))
        pending = []
        for b in batches:
            if self._load(config, b, keys[b]):
                tracker.step(len(keys[b]), decoded=False)
            elif self._run_leased(config, b, keys[b]):
                tracker.step(len(keys[b]), decoded=True)
            else:
                pending.append(b)
        while pending:  # batches another process is decoding
            time.sleep(self.poll_s)
            for b in list(pending):
                if self._load(config, b, keys[b]):
                    pending.remove(b)
                    tracker.step(len(keys[b]), decoded=False)
                elif self._run_leased(config, b, keys[b]):
                    pending.remove(b)
                    tracker.step(len(keys[b]), decoded=True)
        tracker.finish()

    def _load(self, config: str, batch: int, keys: list[str]) -> bool:
        """Take what the store has of this batch; True when it has all of it."""
        found = self.store.get(keys)
        for i, key in zip(self._span(batch), keys):
            if key in found:
                self._outcomes[config][i] = found[key]
        return len(found) == len(keys)

    def _run_leased(self, config: str, batch: int, keys: list[str]) -> bool:
        """Decode the batch under its lease; False when another live process holds it."""
        lease = "batch:" + content_key({"keys": keys})
        if not self.store.take_lease(lease):
            return False
        try:
            if not self._load(config, batch, keys):  # finished by another process meanwhile?
                self._decode(config, batch, keys)
        finally:
            self.store.release(lease)
        return True

    def _decode(self, config: str, batch: int, keys: list[str]) -> None:
        span = self._span(batch)
        prompts = [self.cal.prompts[i] for i in span]
        engine_name, engine_args = self.cal.engines[config]
        where = f"batch {batch + 1} of config {config!r} (prompts {prompts[0].id} .. {prompts[-1].id})"
        try:
            engine = self.engines.get(engine_name, engine_args)
            generations = self._generate(engine, prompts, self.cal.params[config])
            if len(generations) != len(prompts):
                raise ValueError(f"returned {len(generations)} generations for {len(prompts)} prompts")
        except Exception as e:
            error = DecodeError(f"engine {engine_name!r} failed on {where}: {type(e).__name__}: {e}", traceback.format_exc())
            for i in span:
                if i not in self._outcomes[config]:
                    self._errors[(config, i)] = error
            return
        for i, key, prompt, generation in zip(span, keys, prompts, generations):
            if i in self._outcomes[config]:
                continue  # stored before the batch was decoded again
            try:
                outcome = self._score(prompt, generation)
            except Exception as e:
                self._errors[(config, i)] = DecodeError(
                    f"scoring prompt {prompt.id!r} of config {config!r} failed: {type(e).__name__}: {e}", traceback.format_exc()
                )
                continue
            self.store.put(key, outcome, grid=self.cal.grid.name, config=config, prompt=prompt.id)
            self._outcomes[config][i] = outcome

    def _generate(self, engine: Any, prompts: list, params: Mapping[str, Any]) -> list:
        timeout = self.cal.grid.timeout
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

    def _score(self, prompt: Any, generation: Any) -> StoredOutcome:
        if not isinstance(generation.text, str):
            raise TypeError(f"Generation.text must be a str, got {type(generation.text).__name__}")
        if generation.correct is not None:
            correct = bool(generation.correct)
        elif self.cal.suite is None:
            raise ValueError("the engine set no `correct` and the grid has no suite to score the text")
        else:
            correct = bool(self.cal.suite.score(prompt, generation.text))
        return StoredOutcome(
            correct=correct,
            tokens=_number(generation.tokens, "tokens"),
            forwards=_number(generation.forwards, "forwards"),
            extra={str(k): _number(v, f"extra[{k!r}]") for k, v in dict(generation.extra).items()},
            text=generation.text,
            session=self.session,
        )


class _Progress:
    """Progress lines while a config decodes: one per batch at most every PROGRESS_EVERY_S, and
    a last one if any was shown or the decode took that long. Quick or cached configs stay quiet."""

    def __init__(self, decoder: Decoder, config: str, prompts: int, batches: int) -> None:
        self.decoder, self.config, self.prompts, self.batches = decoder, config, prompts, batches
        self.done = self.decoded = self.prompts_done = self.shown = 0
        self.start = self.last = time.monotonic()

    def step(self, prompts: int, decoded: bool) -> None:
        self.done += 1
        self.prompts_done += prompts
        self.decoded += decoded
        now = time.monotonic()
        if decoded and now - self.last >= PROGRESS_EVERY_S and self.done < self.batches:
            self.emit(now)

    def finish(self) -> None:
        now = time.monotonic()
        if self.decoded and (self.shown or now - self.start >= PROGRESS_EVERY_S):
            self.emit(now)

    def emit(self, now: float) -> None:
        d = self.decoder
        self.last = now
        self.shown += 1
        d.progress(
            f"redline {d.cal.grid.name} {self.config}: {self.prompts_done}/{self.prompts} prompts, "
            f"batch {self.done}/{self.batches} ({self.decoded} decoded), {now - self.start:.1f} s"
        )


def _suite_identity(cal: Calibration) -> dict[str, Any] | None:
    if cal.suite is None:
        return None
    kind = type(cal.suite)
    return {
        "suite": cal.grid.suite,
        "suite_args": dict(cal.grid.suite_args),
        "scorer": f"{kind.__module__}.{kind.__qualname__}",
        "version": str(getattr(cal.suite, "version", "")),
    }


def _prompt_identity(prompt: Any) -> dict[str, Any]:
    return {"id": prompt.id, "text": prompt.text, "messages": list(prompt.messages), "meta": dict(prompt.meta)}


def _number(value: Any, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise TypeError(f"Generation.{what} must be a finite number or None, got {value!r}")
    return float(value)
