"""Which prompts each candidate is decoded on: reference first, then exact early stopping.

A prompt the reference answers wrongly can never add to any V(lambda), so candidates skip
it. The reference-correct prompts are visited in one random order fixed by a seed (shared
by all candidates), ``batch_size`` at a time, and a candidate stops as soon as its certification
is decided whatever its remaining prompts show:

- **cannot be certified**: its lowest possible final p-value, ``P[Bin(n, alpha) <= V_so_far]``,
  exceeds the most lenient threshold of the correction (Holm: delta, its last step;
  Bonferroni: delta / m, its only one), so no outcome of the rest can make it valid;
- **certain to pass**: even if every remaining reference-correct prompt regressed,
  ``P[Bin(n, alpha) <= V_so_far + remaining] <= delta / m``, the strictest threshold, which a
  config always passes whatever the other configs' p-values are.

Why the certificate is unchanged: Holm's step-down rejects every p-value at or below
delta / m, and never one above delta; between the two, a config's fate depends only on the
p-values at or below its own. A config stopped as *certain* has a true p-value at or below
delta / m, and one stopped as *cannot* a true p-value above delta, so replacing their exact
p-values by the bounds (:meth:`StopRule.bound`) leaves every config's valid / not-valid
status as the full run's. Every other candidate runs on every reference-correct prompt,
so its V(lambda) is exact.

Why the deployment is unchanged: the deployed config is the best-cost one among the valid
configs and the reference, by costs on all n prompts. A candidate's cost on the prompts it
ran on is a biased estimate of that (it skipped the prompts the reference gets wrong, which
are often the long ones), and nothing bounds the cost of the prompts it skipped, so every
valid candidate could beat the current best. So once every schedule has run, the valid set
is known (:func:`contenders`), and the valid candidates, the *contenders*, are decoded on
the prompts they skipped until the deployment is decided. The reference ran on all prompts
already, so its cost is exact.

Adaptive visiting order. The batches are formed once, from the seeded order (above), so each
batch holds the same prompts, and has the same outcome keys, whatever order it is visited in.
A candidate visits first the batches holding the most reference-correct prompts on which the
candidates before it (in config order) regressed, ties in the seeded order
(:meth:`Schedule.visiting`). The order is a function of the reference's outcomes, the seed and
the earlier candidates' outcomes, so every process follows the same one. The argument above
holds for any order: both stops compare the exact V seen so far and the count of prompts not
yet seen against the bounds on the final V (``V_so_far <= V <= V_so_far + remaining``), which
are true whichever prompts were seen, and a candidate not stopped runs on every
reference-correct prompt. So the valid set, the contenders and (below) the deployment are the
full run's. What an adaptive order does change is what the prompts a stopped candidate ran on
say about the rest: they are no longer a uniform sample of its reference-correct prompts, so
its risk estimate, accuracy on the reference-correct prompts and prompts needed are biased
(towards regressions). Those figures are labelled biased wherever the prompts it ran on are not
a prefix of the seeded order (:func:`seeded_prefix`), and stay the uniform-sample estimates
where they are.

Contenders decided by intervals (:mod:`pytest_redline.costbounds`). When the engine declares
hard bounds on each prompt's cost fields, a contender's all-prompt cost lies in an interval:
its decoded prompts exactly, the rest anywhere the bounds allow (a mean cost: a sum; the
pooled tpf: the extremes of a linear-fractional program, found exactly). The intervals are
exact (``Fraction``s of the stored numbers) and nested: decoding a prompt replaces the range
its bounds allowed by a value inside it, since every decoded prompt is checked against its
bounds (one outside makes the run partial). :func:`~pytest_redline.costbounds.standing` drops a
contender c when (1) its best end does not beat the reference (the reference wins ties), (2)
with ``min_gain`` its best end cannot reach it, or (3) another contender d, sure to reach
``min_gain``, has a worst end better than c's best, or equal to it and d listed first. The full
run's deployment is the best true cost among the valid configs and the reference, strictly
better than the reference, ties to the first listed: (1) c cannot beat the reference, (2) c
is not eligible, (3) d is valid and eligible and at least as good as c, ties going to d, so c is
not deployed. Since the intervals only shrink, a drop stays justified to the end. The decoder
decodes, batch by batch, the contender left with the best possible cost, until at most one is
left; that one is then decoded everywhere (unless its interval is already a point, as for a
declared constant such as weight memory), so its cost, and whether it beats the reference, is
exact. The deployment is then the full run's: every dropped contender is provably not it, and
the selection among the rest (the reference, the one left, with exact costs) is the full run's
rule on the full run's costs. The verdict makes the dropped contenders ineligible, which
changes no valid set (eligibility only narrows the choice). This assumes true bounds on the
prompts never decoded; ``--redline-full`` is the audit. An engine without bounds gives
``(-inf, inf)``: such a contender is never dropped and is decoded everywhere, today's rule.
Gate mode decodes only the named config for cost (its gain is reported exactly; the other
valid configs show intervals and the hint says which may beat it); ``all`` mode reports a
deployment, so it decides the contenders as ``select`` does.

For deterministic engines and costs the scheduled run deploys what the full run deploys; a
measured wall time differs between any two runs, so there the ranking is an estimate either way.
The verdict makes the final selection on exact costs too (``costbounds.exact_choice``: a float
mean of rounded ratios could otherwise order two exactly tied contenders differently from the
intervals that settled them). ``min_gain`` is tested exactly on both paths, with every float
(``min_gain`` and the costs) read as the shortest decimal that gives it back
(``costbounds.decimal``), so a gain of exactly ``min_gain`` is eligible either way.

Plain numpy; no pytest, no store. ``Decoder`` drives :meth:`Schedule.run` with a fetch
function, and the verdict checks every stop again with :meth:`StopRule.confirm`.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Collection, Mapping, Sequence

import numpy as np

CANNOT = "cannot be certified"
CERTAIN = "certain to pass"
STOPS = (CANNOT, CERTAIN)
REFERENCE_WRONG = "reference wrong on this prompt"
EARLY_STOP = "early stop, verdict already decided"


@dataclass(frozen=True)
class StopRule:
    """When a candidate's certification is decided, from its violations so far and what is left.

    ``pass_count`` is the largest V whose p-value is at most delta / m, and ``fail_count``
    the largest V whose p-value is at most the most lenient threshold (both from
    :func:`~pytest_redline.risk.critical_count`, the function the test itself uses).
    """

    n: int
    pass_count: int
    fail_count: int

    @classmethod
    def of(cls, n: int, alpha: float, delta: float, m: int, correction: str) -> "StopRule":
        return _rule(cls, int(n), float(alpha), float(delta), int(m), str(correction))  # hashable, whatever was passed

    def decide(self, violations: int, unknown: int) -> str | None:
        """:data:`CANNOT`, :data:`CERTAIN`, or None while the rest could still change its certification.

        ``unknown`` counts the reference-correct prompts without an outcome yet.
        """
        if violations > self.fail_count:
            return CANNOT
        if violations + unknown <= self.pass_count:
            return CERTAIN
        return None

    @staticmethod
    def bound(violations: int, unknown: int, stop: str | None) -> int:
        """The violation count the certificate uses: exact when nothing is unknown, else the
        bound that decided it (lower for CANNOT, upper for CERTAIN)."""
        return violations + unknown if stop == CERTAIN else violations

    def confirm(self, known: Sequence[int], unknown: Sequence[int], stops: Sequence[str | None],
                names: Sequence[str] | None = None) -> tuple[tuple[str | None, ...], np.ndarray]:
        """Check each config's early stop and give the violation counts the certificate uses.

        ``known[i]`` is config i's violations on the prompts it ran, ``unknown[i]`` the
        reference-correct prompts it did not, ``stops[i]`` why it stopped (None: it did not).
        A config with prompts unknown must have the stop the rule decides from its counts, else
        a ValueError (the schedule was not followed). Returns the stops (None where nothing is
        unknown) and each config's :meth:`bound`."""
        confirmed, bounds = [], []
        for i, (v, u, stop) in enumerate(zip(known, unknown, stops, strict=True)):
            v, u = int(v), int(u)
            if u and self.decide(v, u) != stop:
                label = i if names is None else names[i]
                raise ValueError(f"config {label!r} skipped {u} reference-correct prompts, but its stop "
                                 f"({stop!r}) is not what the rule decides from V = {v}")
            stop = stop if u else None
            confirmed.append(stop)
            bounds.append(self.bound(v, u, stop))
        return tuple(confirmed), np.array(bounds, dtype=np.int64)


@functools.lru_cache(maxsize=256)
def _rule(cls: type[StopRule], n: int, alpha: float, delta: float, m: int, correction: str) -> StopRule:
    """:meth:`StopRule.of`, once per grid: the gate asks for it at collection, while
    scheduling and in the verdict."""
    from pytest_redline.risk import critical_count

    strictest = delta / m
    lenient = delta if correction == "holm" else strictest
    return cls(n, critical_count(n, alpha, strictest), critical_count(n, alpha, lenient))


@dataclass(frozen=True)
class CandidateRun:
    """What one candidate was decoded on, and why it stopped (None: it ran to the end)."""

    ran: tuple[int, ...]  # prompt indices, in the order decoded
    stop: str | None  # CANNOT or CERTAIN when it stopped with reference-correct prompts left
    violations: int
    unknown: int  # reference-correct prompts without an outcome (not reached, or errored)


def contenders(
    runs: Sequence[CandidateRun | None], reference: int, n: int, alpha: float, delta: float, correction: str,
) -> tuple[int, ...]:
    """The candidates whose cost can decide the deployment: the valid ones, in config order.

    ``runs[i]`` is candidate i's schedule (None for the reference). Validity comes from
    the violation counts the certificate uses (:meth:`StopRule.bound`), so it is the full
    run's (see the module docstring). A candidate with prompts left unknown (an error) and
    no stop enters with its violations so far; such a run is partial and certifies nothing.
    """
    from pytest_redline import risk

    bounds = [0 if r is None else min(n, StopRule.bound(r.violations, r.unknown, r.stop)) for r in runs]
    valid = risk.certify_counts(bounds, n, np.ones(len(runs)), reference, alpha, delta, correction=correction).valid
    return tuple(i for i, run in enumerate(runs) if run is not None and valid[i])


def seeded_order(n: int, seed: int) -> np.ndarray:
    """The one random order of the n prompts that the seed fixes."""
    return np.random.default_rng(seed).permutation(n)


def seeded_prefix(order: Sequence[int], reference_correct: np.ndarray, ran: np.ndarray) -> np.ndarray:
    """Per config (rows of ``ran``): whether the reference-correct prompts it ran on are a prefix
    of the seeded ``order``'s reference-correct prompts, i.e. a uniform sample of them."""
    visit = [int(i) for i in order if reference_correct[i]]
    counts = np.count_nonzero(ran[:, visit], axis=1)
    return np.array([bool(ran[r, visit[:k]].all()) for r, k in enumerate(counts)], dtype=bool)


class Schedule:
    """The candidates' batches: reference-correct prompts in a seeded order, and the stop rule.

    ``adaptive``: :meth:`run` visits the batches in :meth:`visiting` order (the module docstring)."""

    def __init__(self, n: int, batch_size: int, seed: int, rule: StopRule, adaptive: bool = False) -> None:
        self.n, self.batch_size, self.seed, self.rule, self.adaptive = n, batch_size, seed, rule, adaptive
        self.order = seeded_order(n, seed)

    def batches(self, reference_correct: Sequence[bool]) -> list[tuple[int, ...]]:
        """Reference-correct prompts in the seeded order, ``batch_size`` at a time; each batch
        in prompt order (batches are formed in prompt order, for reproducibility)."""
        visit = [int(i) for i in self.order if reference_correct[i]]
        return [tuple(sorted(visit[k:k + self.batch_size])) for k in range(0, len(visit), self.batch_size)]

    def visiting(self, reference_correct: Sequence[bool], regressed: Collection[int] = ()) -> list[tuple[int, ...]]:
        """The batches in the order a candidate visits them: seeded, or (``adaptive``) the
        batches holding the most prompts in ``regressed`` (where earlier candidates regressed)
        first, ties in the seeded order. The batches themselves are :meth:`batches`'."""
        batches = self.batches(reference_correct)
        if not self.adaptive or not regressed:
            return batches
        regressed = set(regressed)
        return sorted(batches, key=lambda b: -sum(i in regressed for i in b))  # stable: ties keep the seeded order

    def run(
        self,
        reference_correct: Sequence[bool],
        fetch: Callable[[tuple[int, ...]], Mapping[int, bool]],
        regressed: Collection[int] = (),
    ) -> CandidateRun:
        """Decode batch after batch (:meth:`visiting` order) with ``fetch`` (prompt index ->
        correct; an index missing from its answer had no outcome) until the rule decides or the
        prompts run out.

        The first batch is always decoded, so that every candidate's cost is measured.
        """
        batches = self.visiting(reference_correct, regressed)
        unknown = sum(len(b) for b in batches)
        violations, ran = 0, []
        for batch in batches:
            stop = self.rule.decide(violations, unknown)
            if stop is not None and ran:
                return CandidateRun(tuple(ran), stop, violations, unknown)
            results = fetch(batch)
            ran += batch
            unknown -= sum(i in results for i in batch)
            violations += sum(results.get(i) is False for i in batch)
        return CandidateRun(tuple(ran), None, violations, unknown)
