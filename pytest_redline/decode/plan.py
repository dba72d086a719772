"""What to decode next: the reference, the candidates' schedules and the contenders."""
from __future__ import annotations

import math
import traceback
from typing import Mapping, Sequence

from pytest_redline import costbounds, registry
from pytest_redline.decode import pipeline
from pytest_redline.decode.items import Batch, DecodeError
from pytest_redline.decode.progress import Progress
from pytest_redline.decode.store import StoredOutcome
from pytest_redline.schedule import CandidateRun, contenders


class Planner:
    """What to decode next: the reference first, then each candidate's schedule, then the
    contenders on the prompts they skipped (part of :class:`~pytest_redline.decode.decoder.Decoder`)."""

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
                ran = self._ran
                self.past_stop = {c: len(s - ran[c]) for c, s in self._sent_ahead.items() if s - ran[c]}
        return self._runs[config]

    def _ahead(self, config: str) -> None:
        """When every config's engine is I/O-bound, decode the configs after ``config`` now, one
        after another, so that the server does not idle while pytest reports its items: the
        candidates' schedules after the reference, or every other config of a full run."""
        cal = self.cal
        if not all(pipeline.pipelined(self, c) for c in cal.configs):
            return
        candidates = [c for c in cal.configs if c != cal.reference]
        if self.scheduled and candidates:
            if config != cal.reference:
                return
            self._run(candidates[0])
        for name in cal.configs:
            if name not in self._started and self._needed[name] and self._runs.get(name) is None:
                self._started.add(name)
                self._get(name, self._batches_of(self._needed[name]))

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
        tracker = Progress(self, config, sum(map(len, batches)), len(batches), "reference-correct prompts")
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
