"""Getting outcomes: from the store when it has them, else from the engine, in batches.

A :class:`Decoder` serves one grid in one process. It knows which (config, prompt)
outcomes the session needs (:meth:`Decoder.need`, from the selected items). Each outcome
is loaded from the store or decoded by ``engine.generate(batch, params)``, scored by the
suite unless the engine set ``correct``, and committed to the store one outcome at a time.

- The reference, and every config in a full run (``--redline-full``, or a partial
  selection), is decoded in fixed batches of ``batch_size`` prompts in prompt order (so a
  batch is always the same prompts, whatever was selected): the first outcome asked of a
  config gets all that config's needed batches.
- Otherwise candidates follow the :class:`~pytest_redline.schedule.Schedule`: the first
  outcome asked of a candidate gets the reference's outcomes on every prompt, then decodes
  each candidate's scheduled batches one after another until its certification is decided,
  visiting first the batches where the candidates before it regressed (the adaptive order).
  Its other items are :class:`Skipped` on purpose.

Several processes (xdist workers) share the store: a process takes a lease on a batch
before decoding it, and waits for batches whose lease another live process holds. So each
batch, the reference's included, is decoded once, and a worker that needs the reference
waits for the batches others decode. The schedule is a function of the reference's
outcomes and the seed, so every worker follows the same one.
"""
from __future__ import annotations

import math
import numbers
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from pytest_redline import costbounds, pipeline, registry
from pytest_redline.batchrun import BatchRunner
from pytest_redline.calibration import Calibration
from pytest_redline.contracts import Generation, PartialBatch, Prompt
from pytest_redline.enginebook import EngineBook
from pytest_redline.keys import CONTENT_HASHES, ContentHashes, OutcomeKeys, scorer_name
from pytest_redline.schedule import EARLY_STOP, REFERENCE_WRONG, CandidateRun, Schedule, contenders
from pytest_redline.scoring import engine_prompts, judgement, rescored, scoring_version
from pytest_redline.store import OutcomeStore, StoredOutcome, content_key

PROGRESS_EVERY_S = 5.0  # at most this long without a progress line while decoding (plus one batch)


class DecodeError(Exception):
    """No outcome for a prompt: the engine raised or timed out, or the scorer crashed.

    ``short`` is a one-line summary, for items that point to where the error was reported
    in full.
    """

    def __init__(self, message: str, details: str = "", short: str | None = None) -> None:
        super().__init__(message)
        self.message, self.details, self.short = message, details, short or message.splitlines()[0]

    def explain(self, verbose: bool) -> str:
        return f"{self.message}\n{self.details}" if verbose and self.details else self.message


class Skipped(Exception):
    """The schedule skips this item on purpose: its outcome cannot change the verdict.

    ``reason`` is :data:`~pytest_redline.schedule.REFERENCE_WRONG`, ``CANNOT`` or
    ``CERTAIN``; ``recorded`` is the outcome a replayed grid has anyway (None when live).
    """

    def __init__(self, reason: str, recorded: StoredOutcome | None = None) -> None:
        self.reason, self.recorded = reason, recorded
        super().__init__(self.message)

    @property
    def message(self) -> str:
        if self.reason == REFERENCE_WRONG:
            return f"redline: {REFERENCE_WRONG}"
        return f"redline: {EARLY_STOP} ({self.reason})"


@dataclass(frozen=True)
class Batch:
    """Prompts decoded in one ``engine.generate`` call (indices in prompt order)."""

    number: int  # 1-based, among the config's batches
    prompts: tuple[int, ...]


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
        if engines.cache_dir is None:  # engines keep their weight hashes beside the store
            engines.cache_dir = store.path.parent
        self.progress, self.poll_s = progress, poll_s
        self.batch_size = cal.grid.batch_size
        self.runner = BatchRunner(cal.grid.timeout)
        self.schedule = None if cal.full else Schedule(cal.n, self.batch_size, cal.seed, cal.stop_rule(), adaptive=True)
        self.fallback: str | None = None  # why this grid runs in full although scheduling was asked for
        self.config_seconds: dict[str, float] = {}  # wall time spent in engine.generate, per config
        self._planned: set[tuple[str, int]] = set()
        self._needed: dict[str, set[int]] = {name: set() for name in cal.configs}
        self._outcomes: dict[str, dict[int, StoredOutcome]] = {name: {} for name in cal.configs}
        self._errors: dict[tuple[str, int], DecodeError] = {}
        self._config_errors: dict[str, DecodeError] = {}
        self._started: set[str] = set()
        self._scheduled: bool | None = None
        self._reference: list[bool | None] | None = None
        self._key_owner: dict[str, str] = {}  # outcome key -> the first config that used it
        self._shared: set[tuple[str, str]] = set()
        self._runs: dict[str, CandidateRun | None] = {}
        self._ran: dict[str, set[int]] = {}
        self._recorded: dict[str, dict[int, StoredOutcome]] = {}
        self._bounds: dict[str, dict | None] = {}
        self._interval_memo: dict[str, tuple[int, tuple]] = {}
        self.decided: dict[str, dict[str, str]] = {}  # valid candidates not decoded everywhere: why, and their cost interval
        self.keys = OutcomeKeys(cal, engines, ContentHashes(store.path.parent / CONTENT_HASHES))
        self.scoring = scoring_version(cal, scorer_name(cal))
        self.rescored = 0  # stored outcomes judged again because the scoring changed

    # ------------------------------------------------------------------ public

    def need(self, config: str, index: int) -> None:
        """Plan: the session needs ``config``'s outcome on prompt ``index`` (and the reference's)."""
        self._planned.add((config, index))
        self._needed[config].add(index)
        self._needed[self.cal.reference].add(index)

    def outcome(self, config: str, index: int) -> StoredOutcome:
        """The outcome of ``config`` on prompt ``index``.

        Raises :class:`DecodeError` when it has none, and :class:`Skipped` when the
        schedule skips it on purpose.
        """
        if config != self.cal.reference and self.scheduled:
            run = self._run(config)
            if run is not None:
                if index in self._ran[config]:
                    return self._result(config, index)
                reason = REFERENCE_WRONG if not self._reference_correct()[index] else run.stop
                raise Skipped(reason, self._recorded_outcome(config, index) if self.cal.replayed else None)
        if config not in self._started:
            self._started.add(config)
            self._get(config, self._batches_of(self._needed[config]))
        if index not in self._outcomes[config] and (config, index) not in self._errors:
            self._get(config, self._batches_of([index]))  # not planned (no collection hook ran)
        return self._result(config, index)

    def ready(self, config: str, index: int) -> bool:
        """Whether :meth:`outcome` would answer from memory: an outcome decoded or loaded
        earlier in this session, or a skip the schedule already decided. False when it would
        read the store, run the engine (or the replay of a skipped prompt) or raise an error."""
        if config in self._config_errors or (config, index) in self._errors:
            return False
        if config != self.cal.reference and self.scheduled:
            if not self._runs:
                return False
            run = self._runs[config]
            if run is not None:
                if index not in self._ran[config]:
                    return not self.cal.replayed or config in self._recorded
                return index in self._outcomes[config]
        return config in self._started and index in self._outcomes[config]

    @property
    def scheduled(self) -> bool:
        """Whether candidates follow the schedule: not --redline-full, and every item selected."""
        if self._scheduled is None:
            total = self.cal.m * self.cal.n
            if self.schedule is not None and len(self._planned) < total:
                self.fallback = f"{total - len(self._planned)} of {total} items not selected"
            self._scheduled = self.schedule is not None and self.fallback is None
        return self._scheduled

    # ------------------------------------------------------------------ the schedule

    def _run(self, config: str) -> CandidateRun | None:
        """The candidate's schedule (None: it falls back to the full run).

        The first candidate asked runs every candidate's schedule, then decodes the valid
        ones (:func:`~pytest_redline.schedule.contenders`) on the prompts they skipped, so
        that the costs deciding the deployment are on all n prompts."""
        if not self._runs:
            reference = self._reference_correct()
            missing = sum(c is None for c in reference)
            candidates = [c for c in self.cal.configs if c != self.cal.reference]
            if missing:
                self.fallback = f"the reference has no outcome on {missing} prompts"
                self._runs = dict.fromkeys(candidates)
            elif not any(reference):
                self.fallback = "the reference answers no prompt correctly, so candidates' costs could not be measured"
                self._runs = dict.fromkeys(candidates)
            else:
                regressed: set[int] = set()  # where the candidates run so far regressed: visited first
                for name in candidates:
                    self._runs[name] = self._scheduled_run(name, reference, regressed)
                    self._ran[name] = set(self._runs[name].ran)
                    outcomes = self._outcomes[name]
                    regressed.update(i for i in self._ran[name] if i in outcomes and not outcomes[i].correct)
                self._decode_contenders()
        return self._runs[config]

    def _decode_contenders(self) -> None:
        """Decode the valid candidates on the prompts they skipped until the deployment is
        decided (:func:`~pytest_redline.costbounds.standing`, on each one's cost interval from the
        prompts it decoded and its engine's declared bounds on the rest), then the one left on
        all of them. Gate mode decodes only the named config (its gain is reported). A replayed
        grid's costs are on all prompts already: nothing to decode."""
        cal = self.cal
        if cal.replayed:
            return
        runs = [self._runs.get(name) for name in cal.configs]
        valid = contenders(runs, cal.configs.index(cal.reference), cal.n, cal.alpha, cal.delta_share, cal.correction)
        rest = {i: self._rest(cal.configs[i]) for i in valid}
        if cal.mode == "gate":
            named = [i for i in valid if cal.configs[i] == cal.deploy]
            for i in named:
                self._finish(i, rest[i])
            self._decide(valid, {i: "gate mode: decoded for the verdict only" for i in valid if i not in named})
            return
        intervals, out, alive = costbounds.settle(
            cal.m, cal.configs.index(cal.reference), valid, lambda i: self._interval(i, valid), lambda i: bool(rest[i]),
            lambda i: self._get(cal.configs[i], [rest[i].pop(0)]), cal.grid.lower_is_better,
            cal.grid.min_gain if cal.mode == "select" else None, cal.configs,
        )
        for i in alive:
            if intervals[i][0] != intervals[i][1]:
                self._finish(i, rest[i])
        self._decide(valid, out)

    def _rest(self, name: str) -> list[Batch]:
        """The prompts a candidate skipped, in prompt order, ``batch_size`` at a time."""
        rest, size = [j for j in range(self.cal.n) if j not in self._ran[name]], self.batch_size
        return [Batch(k + 1, tuple(rest[s:s + size])) for k, s in enumerate(range(0, len(rest), size))]

    def _finish(self, i: int, batches: list[Batch]) -> None:
        self._get(self.cal.configs[i], batches)
        del batches[:]

    def _interval(self, i: int, valid: Sequence[int]) -> tuple:
        """Config i's all-prompt cost interval (the reference's is exact; (-inf, inf) for a
        config that is neither the reference nor valid)."""
        cal, name = self.cal, self.cal.configs[i]
        if name != cal.reference and i not in valid:
            return -math.inf, math.inf
        decoded = self._outcomes[name]
        count, known = self._interval_memo.get(name, (-1, None))
        if count != len(decoded):  # outcomes only arrive: the count says whether it changed
            known = costbounds.interval(cal.grid.cost, list(decoded.values()), cal.n - len(decoded), self._bounds_of(name))
            self._interval_memo[name] = (len(decoded), known)
        return known

    def _decide(self, valid: Sequence[int], out: Mapping[int, str]) -> None:
        """Mark what each valid candidate ran on, and record those not decoded on every prompt."""
        for i in valid:
            name = self.cal.configs[i]
            errors = range(self.cal.n) if name in self._config_errors else [j for (c, j) in self._errors if c == name]
            self._ran[name] = set(self._outcomes[name]).union(errors)
            low, high = self._interval(i, valid)
            if len(self._outcomes[name]) < self.cal.n and (i in out or low == high):
                reason = out.get(i, "its cost is exact: the declared bounds fix it on the prompts not decoded")
                self.decided[name] = {"out": i in out, "reason": reason, "low": str(low), "high": str(high)}
        if self.decided:
            self.progress(f"redline {self.cal.grid.name}: settled by cost intervals, not decoded on every prompt: "
                          + "; ".join(f"{name} ({d['reason']})" for name, d in self.decided.items()))

    def _bounds_of(self, config: str) -> dict | None:
        """The engine's declared cost bounds for the config, model-free (None: it declares none,
        or they failed: the failure is the config's error)."""
        if config not in self._bounds:
            name, args = self.cal.engines[config]
            self._bounds[config] = None
            try:
                declare = getattr(registry.factory(registry.ENGINES, name), "cost_bounds", None)
                if callable(declare):
                    self._bounds[config] = costbounds.parse(declare(dict(args), self.cal.params[config]),
                                                            f"engine {name!r}, config {config!r}")
            except Exception as e:
                self._config_errors.setdefault(config, DecodeError(
                    f"config {config!r}: its engine's cost_bounds failed: {type(e).__name__}: {e}", traceback.format_exc(),
                    short=f"config {config!r}: its engine's cost_bounds failed"))
        return self._bounds[config]

    def _scheduled_run(self, config: str, reference: list[bool], regressed: set[int]) -> CandidateRun:
        batches = self.schedule.batches(reference)
        tracker = _Progress(self, config, sum(map(len, batches)), len(batches), "reference-correct prompts")
        number = iter(range(1, len(batches) + 1))

        def fetch(prompts: tuple[int, ...]) -> dict[int, bool]:
            self._get(config, [Batch(next(number), prompts)], tracker)
            return {i: self._outcomes[config][i].correct for i in prompts if i in self._outcomes[config]}

        if pipeline.pipelined(self, config):  # batches sent ahead; the stop rule checked as they complete
            run = pipeline.scheduled_run(self, config, reference, regressed, tracker, Batch)
        else:
            run = self.schedule.run(reference, fetch, regressed)
        tracker.finish(f", stopped: {run.stop}" if run.stop else "")
        return run

    def _reference_correct(self) -> list[bool | None]:
        """The reference's judgement on every prompt (None where it has no outcome)."""
        if self._reference is None:
            reference = self.cal.reference
            if reference not in self._started:
                self._started.add(reference)
                self._get(reference, self._batches_of(range(self.cal.n)))
            outcomes = self._outcomes[reference]
            self._reference = [outcomes[i].correct if i in outcomes else None for i in range(self.cal.n)]
        return self._reference

    def _recorded_outcome(self, config: str, index: int) -> StoredOutcome:
        """A replayed grid's outcome of a skipped item: recorded, so free (never stored)."""
        if config not in self._recorded:
            skipped = [i for i in range(self.cal.n) if i not in self._ran[config]]
            prompts = [self.cal.prompts[i] for i in skipped]
            engine_name, engine_args = self.cal.engines[config]
            try:
                generations = self.engines.get(engine_name, engine_args).generate(prompts, self.cal.params[config])
                outcomes = [self._score(p, g) for p, g in zip(prompts, generations)]
            except Exception as e:
                raise DecodeError(f"replay of the skipped prompts of config {config!r} failed: {type(e).__name__}: {e}",
                                  traceback.format_exc()) from None
            self._recorded[config] = dict(zip(skipped, outcomes))
        return self._recorded[config][index]

    # ------------------------------------------------------------------ batches

    def _result(self, config: str, index: int) -> StoredOutcome:
        if config in self._config_errors:
            raise self._config_errors[config]
        if (config, index) in self._errors:
            raise self._errors[(config, index)]
        return self._outcomes[config][index]

    def _batches_of(self, indices: Iterable[int]) -> list[Batch]:
        """The fixed prompt-order batches holding ``indices`` (the full run's batches)."""
        size, n = self.batch_size, self.cal.n
        return [Batch(b + 1, tuple(range(b * size, min(n, (b + 1) * size)))) for b in sorted({i // size for i in indices})]

    def _keys(self, config: str, batch: Batch) -> list[str]:
        """The outcome keys of a batch (:mod:`pytest_redline.keys`): what decoding depends on,
        stop strings included, and not the scoring version."""
        return self.keys.current(config, [self.cal.prompts[i] for i in batch.prompts])

    def _warn_shared_keys(self, config: str, keys: Iterable[str]) -> None:
        """Two configs whose outcomes have the same key share them: say so once per pair (two
        endpoints under one label, or a server flag changed without a new server_revision)."""
        for key in keys:
            owner = self._key_owner.setdefault(key, config)
            if owner != config and (owner, config) not in self._shared:
                self._shared.add((owner, config))
                self.progress(
                    f"redline {self.cal.grid.name}: warning: configs {owner!r} and {config!r} resolve to the same "
                    "outcome key, so they share outcomes; if they are different deployments, give each its own "
                    "engine_args (an endpoint's label or server_revision)"
                )

    def _get(self, config: str, batches: Sequence[Batch], tracker: "_Progress | None" = None, what: str = "prompts") -> None:
        if config in self._config_errors:
            return
        try:
            keys = {b: self._keys(config, b) for b in batches}
        except Exception as e:  # the engine failed to build, or its fingerprint raised
            self._config_errors[config] = DecodeError(
                f"config {config!r}: {e}", traceback.format_exc(), short=f"config {config!r}: its engine failed to build"
            )
            return
        self._warn_shared_keys(config, [k for ks in keys.values() for k in ks])
        own = tracker is None
        if own:
            tracker = _Progress(self, config, sum(len(b.prompts) for b in batches), len(batches), what)
        if pipeline.pipelined(self, config):  # an I/O-bound engine: every batch's requests at once
            pipeline.decode_batches(self, config, batches, tracker)
            if own:
                tracker.finish()
            return
        pending = list(batches)
        while True:
            for b in list(pending):
                if self._load(config, b, keys[b]):
                    pending.remove(b)
                    tracker.step(len(b.prompts), decoded=False)
                elif self._run_leased(config, b, keys[b]):
                    pending.remove(b)
                    tracker.step(len(b.prompts), decoded=True)
            if not pending:
                break
            time.sleep(self.poll_s)  # batches another process is decoding
        if own:
            tracker.finish()

    def _load(self, config: str, batch: Batch, keys: list[str]) -> bool:
        """Take what the store has of this batch; True when it has all of it."""
        found = self.store.get(keys)
        if len(found) < len(keys):
            found.update(self._legacy(config, batch, keys, found))
        for i, key in zip(batch.prompts, keys):
            if key in found:
                self._outcomes[config][i] = self._current(key, self.cal.prompts[i], found[key])
        return len(found) == len(keys)

    def _legacy(self, config: str, batch: Batch, keys: list[str], found: Mapping[str, StoredOutcome]) -> dict[str, StoredOutcome]:
        """Outcomes stored under an older key format (the legacy chain, each format in order),
        copied to their current keys."""
        copied: dict[str, StoredOutcome] = {}
        for older in self.keys.older(config, [self.cal.prompts[i] for i in batch.prompts]):
            wanted = {old: key for key, old in zip(keys, older) if old is not None and key not in found and key not in copied}
            if not wanted:
                break
            for old_key, outcome in self.store.get(wanted).items():
                self.store.put(wanted[old_key], outcome, grid=self.cal.grid.name, config=config)
                copied[wanted[old_key]] = outcome
        return copied

    def _current(self, key: str, prompt: Prompt, outcome: StoredOutcome) -> StoredOutcome:
        """A stored outcome under the current scoring: judged again (and updated in the store)
        when the scoring version changed; nothing is decoded."""
        again = rescored(self.cal, prompt, outcome, self.scoring)
        if again is None:
            return outcome
        self.store.rescore(key, again)
        self.rescored += 1
        return again

    def _run_leased(self, config: str, batch: Batch, keys: list[str]) -> bool:
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

    def _decode(self, config: str, batch: Batch, keys: list[str]) -> None:
        engine_name, engine_args = self.cal.engines[config]
        where = f"batch {batch.number} of config {config!r} ({_span(batch, [self.cal.prompts[i] for i in batch.prompts])})"
        bounds = self._bounds_of(config)  # declared before decoding
        start = time.monotonic()
        missing: dict[int, BaseException] = {}  # prompt index -> why a partial batch has no answer for it
        try:
            engine = self.engines.get(engine_name, engine_args)
            if getattr(engine, "batch_invariant", False):  # the batch changes no answer: send only what is missing
                kept = [(i, k) for i, k in zip(batch.prompts, keys) if i not in self._outcomes[config]]
                batch, keys = Batch(batch.number, tuple(i for i, _ in kept)), [k for _, k in kept]
            prompts = [self.cal.prompts[i] for i in batch.prompts]
            try:
                generations = self.runner.generate(engine, engine_prompts(self.cal, prompts), self.cal.params[config])
            except PartialBatch as e:  # keep every answer received
                generations = [e.generations.get(j) for j in range(len(prompts))]
                missing = {batch.prompts[j]: error for j, error in e.errors.items()}
            if len(generations) != len(prompts):
                raise ValueError(f"returned {len(generations)} generations for {len(prompts)} prompts")
        except Exception as e:
            error = DecodeError(f"engine {engine_name!r} failed on {where}: {type(e).__name__}: {e}", traceback.format_exc(),
                                short=f"engine {engine_name!r} failed on {where}")
            for i in batch.prompts:
                if i not in self._outcomes[config]:
                    self._errors[(config, i)] = error
            return
        finally:
            self.config_seconds[config] = self.config_seconds.get(config, 0.0) + time.monotonic() - start
        for i, key, prompt, generation in zip(batch.prompts, keys, prompts, generations):
            if i in self._outcomes[config]:
                continue  # stored before the batch was decoded again
            if generation is None:
                error = missing.get(i)
                self._prompt_failed(config, i, f"engine {engine_name!r} got no answer for prompt {prompt.id!r} on {where}: "
                                    f"{type(error).__name__}: {error}", "")
                continue
            self._accept(config, i, key, prompt, generation, engine_name, bounds)

    def _accept(self, config: str, i: int, key: str, prompt: Prompt, generation: Generation, engine_name: str,
                bounds: Any) -> None:
        """Score one answer and store it, unless it cannot be scored or breaks its engine's bounds."""
        try:
            outcome = self._score(prompt, generation)
        except Exception as e:
            self._errors[(config, i)] = DecodeError(
                f"scoring prompt {prompt.id!r} of config {config!r} failed: {type(e).__name__}: {e}", traceback.format_exc()
            )
            return
        broken = bounds and costbounds.violation(bounds, outcome, next(iter(self._outcomes[config].values()), None))
        if broken:  # an engine error: the run is partial; not stored, so a rerun decodes it again
            self._errors[(config, i)] = DecodeError(
                f"engine {engine_name!r} broke its declared cost bounds on config {config!r}, prompt {prompt.id!r}: {broken}")
            return
        self.store.put(key, outcome, grid=self.cal.grid.name, config=config, prompt=prompt.id)
        self._outcomes[config][i] = outcome

    def _prompt_failed(self, config: str, i: int, message: str, details: str) -> None:
        """No outcome for prompt ``i``: an item error (a rerun decodes it again)."""
        self._errors[(config, i)] = DecodeError(message, details, short=message.split(": ", 1)[0] if ": " in message else message)

    def _config_failed(self, config: str, error: Exception) -> None:
        """The config's engine failed to build, or its identity raised: every item is an error."""
        self._config_errors.setdefault(config, DecodeError(
            f"config {config!r}: {error}", traceback.format_exc(), short=f"config {config!r}: its engine failed to build"))

    def _score(self, prompt: Prompt, generation: Generation) -> StoredOutcome:
        if not isinstance(generation.text, str):
            raise TypeError(f"Generation.text must be a str, got {type(generation.text).__name__}")
        return StoredOutcome(
            **judgement(self.cal, prompt, generation, self.scoring),
            tokens=_finite_or_none(generation.tokens, "tokens"),
            forwards=_finite_or_none(generation.forwards, "forwards"),
            extra={str(k): _finite_or_none(v, f"extra[{k!r}]") for k, v in dict(generation.extra).items()},
            text=generation.text,
            session=self.session,
        )


class _Progress:
    """Progress lines while a config decodes: one per batch at most every PROGRESS_EVERY_S, and
    a last one if any was shown or the decode took that long. Quick or cached configs stay quiet."""

    def __init__(self, decoder: Decoder, config: str, prompts: int, batches: int, what: str = "prompts") -> None:
        self.decoder, self.config, self.prompts, self.batches = decoder, config, prompts, batches
        self.what = what  # what the denominator counts: a scheduled candidate's are the reference-correct prompts
        self.done = self.decoded = self.prompts_done = self.shown = 0
        self.start = self.last = time.monotonic()

    def step(self, prompts: int, decoded: bool) -> None:
        self.done += 1
        self.prompts_done += prompts
        self.decoded += decoded
        now = time.monotonic()
        if decoded and now - self.last >= PROGRESS_EVERY_S and self.done < self.batches:
            self.emit(now)

    def finish(self, note: str = "") -> None:
        now = time.monotonic()
        if self.decoded and (self.shown or now - self.start >= PROGRESS_EVERY_S):
            self.emit(now, note)

    def emit(self, now: float, note: str = "") -> None:
        d = self.decoder
        self.last = now
        self.shown += 1
        d.progress(
            f"redline {d.cal.grid.name} {self.config}: {self.prompts_done}/{self.prompts} {self.what}, "
            f"batch {self.done}/{self.batches} ({self.decoded} decoded), {now - self.start:.1f} s{note}"
        )


def _span(batch: Batch, prompts: list) -> str:
    first, last = prompts[0].id, prompts[-1].id
    if batch.prompts[-1] - batch.prompts[0] == len(batch.prompts) - 1:
        return f"prompts {first} .. {last}"
    return f"{len(prompts)} scheduled prompts from {first} to {last}"


def _finite_or_none(value: Any, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise TypeError(f"Generation.{what} must be a finite number or None, got {value!r}")
    return float(value)
