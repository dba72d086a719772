"""The verdict on one grid: certify its outcomes and decide what the mode requires.

- ``all`` (no ``deploy``): every candidate must be valid;
- ``gate`` (``deploy: NAME``): that config must be valid;
- ``select`` (``deploy: fastest``): nothing must be, and the deployed config is reported.

A partial run (some item produced no outcome) certifies nothing, in every mode.

A scheduled run (some items skipped on purpose) is certified by :func:`certify_scheduled`
from what each config ran on: each stop is checked again against the
:class:`~pytest_redline.schedule.StopRule`, and a stopped config enters Holm's procedure
with the violation bound that decided it, which leaves every config's valid / not-valid
status as the full run's (see :mod:`pytest_redline.schedule`).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from types import SimpleNamespace
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import numpy as np

from pytest_redline.calibration import Calibration
from pytest_redline.ledger import GridRecord, Missing
from pytest_redline.outcomes import OutcomeError, OutcomeTable, gain_kind
from pytest_redline.schedule import CANNOT, CERTAIN, StopRule, seeded_order, seeded_prefix
from pytest_redline.spend import Spend

if TYPE_CHECKING:  # imported when used: the statistics load scipy, which a collection-only run never needs
    from pytest_redline.risk import RedlineResult, Reverse

POWER = 0.8
PROMPTS_LIMIT = 20_000  # the exact count takes seconds per ten thousand prompts; beyond this, say "more than"
BOUNDS = {None: "exact", CANNOT: "lower", CERTAIN: "upper"}  # what a config's violation count is


@dataclass(frozen=True)
class Scheduled:
    """How a scheduled run certified each config (arrays and tuples: one entry per config).

    ``ran`` (configs x prompts) marks the prompts each config ran on; ``bounds`` says whether
    its violation count is ``exact``, a ``lower`` bound (stopped: cannot be certified) or an
    ``upper`` bound (stopped: certain to pass); ``risk_estimate`` is V / n when V is exact or
    the grid replayed, else the violation rate on the reference-correct prompts it ran on
    (a uniform sample of them, by the seeded order) times their share of n.
    ``complete_rows`` marks the configs whose cost and accuracy are on all n prompts (every
    config of a replayed grid; in a live run the reference and the valid candidates, which
    are decoded on the prompts they skipped); the others' figures are on the prompts they
    ran on, not comparable. ``on_reference_correct`` is each config's accuracy on the
    reference-correct prompts it ran on (a uniform sample of them): comparable across rows.
    ``biased`` marks the configs whose prompts run are not a uniform sample: a live config that
    stopped early on prompts that are not a prefix of the seeded order (the adaptive order
    visited other batches first), so its ``risk_estimate``, ``on_reference_correct`` and the
    prompts needed that follow from them lean towards the regressions (:mod:`pytest_redline.schedule`).
    """

    result: RedlineResult
    ran: np.ndarray
    stops: tuple[str | None, ...]
    bounds: tuple[str, ...]
    risk_estimate: np.ndarray
    complete_rows: np.ndarray
    on_reference_correct: np.ndarray
    seen: np.ndarray | None = None  # V counted where known: on the prompts run (a lower bound), or on all (replayed)
    reverse: Reverse | None = None  # the reverse family ("exceeds budget") on ``seen``
    biased: np.ndarray | None = None  # per config; None: every estimate is a uniform-sample one
    alpha_min: float | None = None  # with ``everything`` (a replay): the smallest alpha deploying a candidate


def certify_scheduled(
    correct: np.ndarray,
    ran: np.ndarray,
    stops: Sequence[str | None],
    cost: np.ndarray,
    reference: int,
    rule: StopRule,
    alpha: float,
    delta: float,
    *,
    everything: np.ndarray | None = None,
    names: Sequence[str] | None = None,
    lower_is_better: bool = False,
    gain: str | None = None,
    correction: str = "holm",
    min_gain: float | None = None,
    decided: Mapping[int, bool] | None = None,
    order: Sequence[int] | None = None,
    choose: Callable[[list[int]], int | None] | None = None,
) -> Scheduled:
    """Certify a scheduled run: ``correct`` counts only where ``ran``.

    ``stops[i]`` is why config i stopped early (None when it was not). The reference must
    have run on every prompt, and a config with a reference-correct prompt it did not run
    must have a stop that the rule confirms from its violations so far and the prompts left
    (:meth:`StopRule.confirm`); anything else is a ValueError (the schedule was not followed).
    ``cost`` is each config's cost (on the prompts it ran on, or on all when ``everything`` is
    known). ``everything`` (configs x prompts, replayed grids) gives accuracy on all prompts
    and alpha_min. Without it (a live run) every valid config must have run on every prompt,
    since its cost decides the deployment (a ValueError otherwise); the others' accuracy and
    net accuracy are NaN (not measured on all prompts). ``min_gain`` and ``choose`` are
    :func:`risk.certify_grid`'s. ``decided`` (config -> whether it is out) names the valid
    configs the contenders' cost intervals settled without decoding them on every prompt
    (:mod:`pytest_redline.costbounds`): those out are not eligible, the others' cost is exact.
    ``order`` (the seeded order of all n prompts) marks the ``biased`` estimates.

    The schedule's checks come first and the statistics last, in one call each.
    """
    from pytest_redline import risk

    correct, ran = np.asarray(correct, dtype=bool), np.asarray(ran, dtype=bool)
    m, n = correct.shape
    if not ran[reference].all():
        raise ValueError("the reference did not run on every prompt")
    ref_right = correct[reference]
    known = np.count_nonzero(ran & ref_right & ~correct, axis=1)
    unknown = np.count_nonzero(~ran & ref_right, axis=1)
    rows = np.ones(m, dtype=bool) if everything is not None else ran.all(axis=1)
    table = np.asarray(everything, dtype=bool) if everything is not None else correct
    accuracy = np.where(rows, np.count_nonzero(table, axis=1) / n, np.nan)
    right_run = ran & ref_right if everything is None else np.broadcast_to(ref_right, ran.shape)
    kept = np.count_nonzero(right_run & table, axis=1) / np.maximum(np.count_nonzero(right_run, axis=1), 1)
    decided = dict(decided or {})
    out = [i for i, is_out in decided.items() if is_out]
    stops, bound = rule.confirm(known, unknown, stops, names)
    uniform = seeded_prefix(order, ref_right, ran) if everything is None and order is not None else None
    cert = risk.certify_grid(
        n, cost, reference, alpha, delta, violations=bound, correct=everything, seen=None if everything is not None else known,
        accuracy=accuracy, names=names, lower_is_better=lower_is_better, gain=gain, correction=correction,
        min_gain=min_gain, ineligible=out, choose=choose,
    )
    result, seen = cert.result, cert.reverse.violations
    if everything is not None:  # replayed: the risk itself
        estimate = seen / n
    else:
        right_ran = np.count_nonzero(ran & ref_right, axis=1)
        estimate = np.where(unknown > 0, known / np.maximum(right_ran, 1) * ref_right.sum() / n, bound / n)
    short = [i for i in np.flatnonzero(result.valid & ~rows) if i not in decided]
    if short:
        i = int(short[0])
        label = i if names is None else names[i]
        raise ValueError(f"config {label!r} is valid, so its cost decides the deployment, but it ran on "
                         f"{int(ran[i].sum())} of {n} prompts (the schedule decodes valid configs on every prompt)")
    return Scheduled(
        result=result,
        ran=_frozen(ran),
        stops=stops,
        bounds=tuple(BOUNDS[s] for s in stops),
        risk_estimate=_frozen(estimate),
        complete_rows=_frozen(rows),
        on_reference_correct=_frozen(kept),
        seen=_frozen(seen),
        reverse=cert.reverse,
        biased=None if uniform is None else _frozen((unknown > 0) & ~uniform),
        alpha_min=cert.alpha_min,
    )


@dataclass(frozen=True)
class GridVerdict:
    cal: Calibration
    record: GridRecord
    result: RedlineResult | None = None  # when the run was complete
    alpha_min: float | None = None
    table: OutcomeTable | None = None  # when every outcome is known
    error: str | None = None  # the outcomes could not be certified (e.g. a cost column is empty)
    scheduled: Scheduled | None = None  # how a scheduled run certified each config
    spend: Spend | None = None  # forwards and time spent against the full grid
    how_run: str = "full"  # "scheduled", "full (--redline-full)", or "full: <why scheduling could not hold>"
    reverse: Reverse | None = None  # the reverse family ("exceeds budget"), beside the certificates
    decided: Mapping[str, Mapping[str, str]] | None = None  # valid configs the cost intervals settled (Decoder.decided)

    @property
    def statuses(self) -> tuple[str, ...] | None:
        """Each config's status, in grid order: "certified", "exceeds budget" or "inconclusive"
        (None when nothing was certified: a partial run, or an error)."""
        if self.result is None or self.reverse is None:
            return None
        from pytest_redline.risk.reverse import statuses

        return statuses(self.result.valid, self.reverse.exceeds)

    def status(self, name: str) -> str | None:
        statuses = self.statuses
        return None if statuses is None else statuses[self.result.names.index(name)]

    @property
    def status_bounded(self) -> bool:
        """Whether the reverse test used a lower bound on some config's V (a scheduled live run
        that stopped a config early), so it may say "inconclusive" where a full run says
        "exceeds budget"."""
        sched = self.scheduled
        return sched is not None and self.table is None and any(s is not None for s in sched.stops)

    @property
    def complete(self) -> bool:
        return self.record.complete

    @property
    def missing(self) -> tuple[Missing, ...]:
        return self.record.missing

    @property
    def required(self) -> tuple[str, ...]:
        """The configs this grid's mode requires to be certified."""
        cal = self.cal
        if cal.mode == "select":
            return ()
        if cal.mode == "gate":
            return (cal.deploy,)
        return tuple(c for c in cal.configs if c != cal.reference)

    @property
    def not_certified(self) -> tuple[str, ...]:
        """Required configs that are not valid (all of them when nothing was certified)."""
        if self.result is None:
            return self.required
        valid = dict(zip(self.result.names, self.result.valid))
        return tuple(c for c in self.required if not valid[c])

    @property
    def certified(self) -> bool:
        return self.complete and self.result is not None and not self.not_certified

    @property
    def deployed_index(self) -> int | None:
        """The config to serve. Gate mode: the named config when certified, else the
        reference; the other modes: the best valid config or the reference (None when
        nothing was certified)."""
        if self.cal.mode == "gate":
            return self.cal.configs.index(self.cal.deploy if self.certified else self.cal.reference)
        return None if self.result is None else self.result.deployed_index

    @property
    def deployed(self) -> str | None:
        i = self.deployed_index
        return None if i is None else self.cal.configs[i]

    @property
    def best_valid(self) -> str | None:
        """The best-cost config among the valid ones and the reference (what selection would
        deploy): in gate mode a hint beside the named config."""
        return None if self.result is None else self.result.deployed

    def comparable(self, i: int) -> bool:
        """Whether config i's cost and accuracy are on all n prompts (comparable across rows)."""
        return self.scheduled is None or bool(self.scheduled.complete_rows[i])

    def cost_interval(self, i: int) -> tuple[float, float] | None:
        """A valid config's all-prompt cost interval when the contenders' intervals settled it
        without decoding it everywhere (:mod:`pytest_redline.costbounds`); None otherwise."""
        d = (self.decided or {}).get(self.cal.configs[i])
        return None if d is None else (_exact(d["low"]), _exact(d["high"]))

    def cost_known(self, i: int) -> bool:
        """Whether config i's cost is its all-prompt cost (decoded everywhere, or fixed by bounds)."""
        interval = self.cost_interval(i)
        return self.comparable(i) or (interval is not None and interval[0] == interval[1])

    @property
    def best_valid_open(self) -> tuple[str, ...]:
        """Gate mode: valid configs not decoded for cost whose interval may still beat
        :attr:`best_valid` (then the hint is one of them or it)."""
        if self.result is None or self.cal.mode != "gate" or not self.decided:
            return ()
        r, lower = self.result, self.cal.grid.lower_is_better
        best = float(r.cost[r.deployed_index])
        beats = (lambda lo, hi: lo < best) if lower else (lambda lo, hi: hi > best)
        return tuple(name for name in self.decided if beats(*self.cost_interval(self.cal.configs.index(name))))

    def on_reference_correct(self) -> np.ndarray:
        """Each config's accuracy on the reference-correct prompts (those it ran on, in a
        scheduled run): the one accuracy figure every row of a scheduled run has."""
        if self.scheduled is not None:
            return self.scheduled.on_reference_correct
        right = self.table.correct[self.result.reference_index]
        return np.count_nonzero(self.table.correct & right, axis=1) / max(int(right.sum()), 1)

    def estimate_biased(self, i: int) -> bool:
        """Whether config i's risk estimate, accuracy on the reference-correct prompts and prompts
        needed come from prompts the adaptive order chose, not a uniform sample (:class:`Scheduled`)."""
        sched = self.scheduled
        return bool(sched is not None and sched.biased is not None and sched.biased[i])

    def risk_estimate(self, i: int) -> float:
        return float(self.scheduled.risk_estimate[i] if self.scheduled else self.result.risk[i])

    def prompts_needed(self, name: str) -> int | None:
        """Prompts that would certify ``name`` with 80 % power if its observed risk held; None if
        no n would, or if more than :data:`PROMPTS_LIMIT` would (:meth:`needs_over_limit`)."""
        from pytest_redline.planning import prompts_needed

        if self._risk_of(name) >= self.cal.alpha or self.needs_over_limit(name):
            return None
        return prompts_needed(self.cal.alpha, self._risk_of(name), self.cal.m, self.cal.delta_share, power=POWER)

    def needs_over_limit(self, name: str) -> bool:
        """Whether certifying ``name`` would take over PROMPTS_LIMIT prompts (normal approximation)."""
        from pytest_redline.planning import prompts_needed_approx

        risk = self._risk_of(name)
        if risk >= self.cal.alpha:
            return False
        return prompts_needed_approx(self.cal.alpha, risk, self.cal.m, self.cal.delta_share, power=POWER) > PROMPTS_LIMIT

    def _risk_of(self, name: str) -> float:
        return self.risk_estimate(self.result.names.index(name))

    def to_settle(self, name: str) -> Settle | None:
        """For an inconclusive candidate: the prompts that would settle it with 80 % power if its
        observed risk R held (None for any other status, and for the reference). R < alpha:
        prompts to certify it; R > alpha: prompts to show it exceeds the budget; R = alpha:
        no n settles it."""
        from pytest_redline.risk import INCONCLUSIVE
        from pytest_redline.planning import reverse_prompts_needed, reverse_prompts_needed_approx

        if name == self.cal.reference or self.status(name) != INCONCLUSIVE:
            return None
        risk, alpha = self._risk_of(name), self.cal.alpha
        if math.isclose(risk, alpha, rel_tol=1e-12):
            return Settle("none", risk, None, False)
        if risk < alpha:
            over = self.needs_over_limit(name)
            return Settle("certify", risk, None if over else self.prompts_needed(name), over)
        args = (alpha, risk, self.cal.m, self.cal.delta_share)
        over = reverse_prompts_needed_approx(*args, power=POWER) > PROMPTS_LIMIT
        return Settle("exceeds", risk, None if over else reverse_prompts_needed(*args, power=POWER), over)

    @property
    def poor_trade(self) -> str | None:
        """The deployed config loses more accuracy points than it gains percent of the cost
        (costs whose gain is a percentage: tpf, apf, any higher-is-better cost); None when
        not, or when the gain is a reduction factor (memory: see docs/explanation/verdict.md)."""
        r, d = self.result, self.deployed_index
        if r is None or d is None or d == r.reference_index or r.gain_kind != "percent":
            return None
        drop, gain = -float(r.net_accuracy[d]), float(r.gain[d])
        if not drop > gain:  # NaN (accuracy not on all prompts) never flags
            return None
        return (f"poor trade: {r.names[d]} gives up {drop:.1f} accuracy points for {gain:+.1f}% {self.cal.grid.cost} "
                "(more points lost than percent gained)")

    @property
    def slower_than_reference(self) -> bool:
        """Gate mode: the requested config is certified but worse than the reference on the cost."""
        if self.cal.mode != "gate" or not self.certified:
            return False
        r = self.result
        i = r.names.index(self.cal.deploy)
        return bool(r.gain[i] < (0.0 if r.gain_kind == "percent" else 1.0))


@dataclass(frozen=True)
class Settle:
    """What would settle an inconclusive config: ``test`` is "certify", "exceeds" or "none"
    (R = alpha: no n settles it); ``prompts`` the calibration size for 80 % power at ``risk``
    (None when over :data:`PROMPTS_LIMIT`, ``over_limit``, or when no n settles it)."""

    test: str
    risk: float
    prompts: int | None
    over_limit: bool

    def text(self) -> str:
        if self.test == "none":
            return f"no n settles it (risk {self.risk:.4f} = alpha)"
        what = "certify it" if self.test == "certify" else "show it exceeds the budget"
        if self.over_limit:
            return f"over {PROMPTS_LIMIT} prompts would {what} at risk {self.risk:.4f}"
        return f"n={self.prompts} prompts would {what} with 80% power at risk {self.risk:.4f}"


def decide(record: GridRecord, spend: Spend | None = None, how_run: str = "full",
          decided: Mapping[str, Mapping[str, str]] | None = None) -> GridVerdict:
    """The gate's verdict on a grid: certify its outcomes (nothing is certified from a partial run).

    One pass down the layers, each visited once: what the ledger recorded, the outcome table's
    slices, the grid's settings, the schedule's checks, then the statistics in one call
    (:func:`risk.certify_grid`, which asks :mod:`~pytest_redline.costbounds` for the deployment
    on exact costs). ``tests/gate/test_verdict_walk.py`` profiles it."""
    from pytest_redline import costbounds, risk

    cal, decided = record.cal, dict(decided or {})
    if not record.complete:
        return GridVerdict(cal, record, spend=spend, how_run=how_run)
    skip_error = record.schedule_error()
    ran = record.ran() if record.skips else None
    stops = record.stops() if record.skips else None
    table = record.table()  # every outcome (a replayed grid's skipped items too), or None
    seen = table if table is not None or ran is None else record.table(ran_only=True)
    kind, gain, min_gain = cal.grid.cost, gain_kind(cal.grid.direction), cal.grid.min_gain
    try:
        if skip_error is not None:
            raise ValueError(skip_error)
        out, points, dropped = {}, {}, []  # what the cost intervals settled, by config index (a loop: the walk stays here)
        for name, d in decided.items():
            i = cal.configs.index(name)
            out[i] = bool(d.get("out"))
            if out[i]:
                dropped.append(i)
            elif d["low"] == d["high"]:
                points[i] = Fraction(d["low"])
        cost = table.cost(kind) if table is not None else seen.cost_on(ran, kind)
        correct = None if ran is None else seen.select(ran).correct
        lower = cal.grid.lower_is_better
        n, m, reference, select = cal.n, cal.m, cal.configs.index(cal.reference), cal.mode == "select"
        rule = None if ran is None else cal.stop_rule()
        order = None if ran is None else seeded_order(n, cal.seed)
        costed = table if table is not None else seen  # exact costs: the arrays, not the table's methods
        cells = SimpleNamespace(tokens=costed.tokens, forwards=costed.forwards, extra=costed.extra, n=n)
        complete = range(m) if table is not None else np.flatnonzero(ran.all(axis=1))
        choose = functools.partial(costbounds.exact_choice, cells, kind, complete, points, reference=reference,
                                   lower_is_better=lower, min_gain=min_gain if select else None, gain_kind=gain)
        options = dict(names=cal.configs, lower_is_better=lower, gain=gain, correction=cal.correction,
                       min_gain=min_gain if select else None, choose=choose)
        if ran is None:
            cert = risk.certify_grid(n, cost, reference, cal.alpha, cal.delta_share, correct=table.correct,
                                     ineligible=dropped, **options)
            result, reverse, alpha_min, scheduled = cert.result, cert.reverse, cert.alpha_min, None
        else:
            scheduled = certify_scheduled(
                correct, ran, stops, cost, reference, rule, cal.alpha, cal.delta_share,
                everything=None if table is None else table.correct, decided=out, order=order, **options,
            )
            result, reverse, alpha_min = scheduled.result, scheduled.reverse, scheduled.alpha_min
    except (OutcomeError, ValueError) as e:
        return GridVerdict(cal, record, spend=spend, how_run=how_run, table=table, error=f"{cal.label}: cannot certify: {e}")
    return GridVerdict(cal, record, result=result, alpha_min=alpha_min, table=table, scheduled=scheduled, spend=spend,
                       how_run=how_run, reverse=reverse, decided=decided)


def _exact(text: str) -> float:
    """A Fraction's text (``p/q``), or ``inf`` / ``-inf``, as a float."""
    return float(text) if "inf" in text else float(Fraction(text))


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.array(a)
    a.setflags(write=False)
    return a
