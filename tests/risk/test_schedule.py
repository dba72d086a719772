"""The schedule without pytest: the stop rule, the batches, and the law that matters: a
scheduled run certifies exactly the configs the full run certifies."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from published import published_table

from pytest_redline import risk
from pytest_redline.report import redline_table
from pytest_redline.outcomes import OutcomeTable
from pytest_redline.schedule import CANNOT, CERTAIN, Schedule, StopRule, contenders, seeded_order, seeded_prefix
from pytest_redline.verdict import certify_scheduled

DELTA = 0.10


def random_table(seed: int, m: int, n: int) -> OutcomeTable:
    """A reference (row 0) and m - 1 candidates with assorted risks, per-prompt costs that vary."""
    rng = np.random.default_rng(seed)
    reference = rng.random(n) < rng.uniform(0.0, 1.0)
    rows = [reference]
    for _ in range(m - 1):
        risk_ = rng.choice([0.0, rng.uniform(0.0, 0.05), rng.uniform(0.0, 0.4)])
        regress = reference & (rng.random(n) < risk_)
        rescue = ~reference & (rng.random(n) < rng.uniform(0.0, 0.5))
        rows.append((reference & ~regress) | rescue)
    correct = np.array(rows)
    tokens = rng.integers(1, 200, size=(m, n)).astype(float)
    forwards = rng.integers(1, 60, size=(m, n)).astype(float)
    names = tuple(f"c{i}" for i in range(m))
    return OutcomeTable(names, tuple(f"p{j}" for j in range(n)), correct, tokens, forwards)


def simulate(table: OutcomeTable, alpha: float, batch: int, seed: int, correction: str = "holm", live: bool = True,
             adaptive: bool = False):
    """What the gate's decoder does, on a table: (ran mask, stops), reference = row 0.

    ``live``: then the valid candidates are decoded on the prompts they skipped (a replayed
    grid's costs are on all prompts already). ``adaptive``: each candidate visits first the
    batches where the candidates before it regressed, as the decoder does."""
    rule = StopRule.of(table.n, alpha, DELTA, table.m, correction)
    schedule = Schedule(table.n, batch, seed, rule, adaptive=adaptive)
    reference = table.correct[0]
    ran = np.zeros(table.correct.shape, dtype=bool)
    ran[0] = True
    runs = [None]
    regressed: set[int] = set()
    for i in range(1, table.m):
        runs.append(schedule.run(reference, lambda prompts: {j: bool(table.correct[i, j]) for j in prompts}, regressed))
        ran[i, list(runs[i].ran)] = True
        regressed.update(j for j in runs[i].ran if not table.correct[i, j])
    if live:
        ran[list(contenders(runs, 0, table.n, alpha, DELTA, correction))] = True
    return ran, [None if r is None else r.stop for r in runs], rule


# --------------------------------------------------------------------------- the stop rule


@given(
    n=st.integers(1, 2000),
    alpha=st.floats(0.01, 0.5),
    m=st.integers(1, 20),
    correction=st.sampled_from(["holm", "bonferroni"]),
    data=st.data(),
)
@example(n=1012, alpha=0.1, m=7, correction="holm", data=None)
def test_equivalent_stop_rule_pvalues(n: int, alpha: float, m: int, correction: str, data) -> None:
    rule = StopRule.of(n, alpha, DELTA, m, correction)
    lenient = DELTA if correction == "holm" else DELTA / m
    draw = data.draw if data is not None else (lambda s: 80)
    v = draw(st.integers(0, n))
    u = draw(st.integers(0, n - v))
    decision = rule.decide(v, u)
    assert (decision == CANNOT) == (risk.binom_pvalue(v, n, alpha) > lenient)
    if decision != CANNOT:
        assert (decision == CERTAIN) == (risk.binom_pvalue(v + u, n, alpha) <= DELTA / m)


@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 300), batch=st.integers(1, 40), data=st.data())
@pytest.mark.slow  # a hypothesis search over partition schedules: 0.23 s CPU, over the inner loop's 50 s budget (issue 25)
def test_partition_schedule_batches(seed: int, n: int, batch: int, data) -> None:
    reference = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    batches = Schedule(n, batch, seed, StopRule(n, 0, 0)).batches(reference)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == [i for i in range(n) if reference[i]]  # every reference-correct prompt, once
    assert all(list(b) == sorted(b) for b in batches)  # each batch in prompt order
    assert all(len(b) == batch for b in batches[:-1])


def test_deterministic_schedule_order_filters_one_permutation() -> None:
    everything = Schedule(100, 1, 7, StopRule(100, 0, 0)).batches([True] * 100)
    assert everything == Schedule(100, 1, 7, StopRule(100, 0, 0)).batches([True] * 100)
    assert everything != Schedule(100, 1, 8, StopRule(100, 0, 0)).batches([True] * 100)
    half = [i % 2 == 0 for i in range(100)]
    assert Schedule(100, 1, 7, StopRule(100, 0, 0)).batches(half) == [b for b in everything if b[0] % 2 == 0]


@given(seed=st.integers(0, 2**32 - 1), batch=st.sampled_from([1, 3, 16]))
def test_exact_early_stop_schedule_run(seed: int, batch: int) -> None:
    table = random_table(seed, 2, 300)
    rule = StopRule.of(300, 0.1, DELTA, 2, "holm")
    reference = table.correct[0]
    fetched = []

    def fetch(prompts):
        fetched.append(prompts)
        return {j: bool(table.correct[1, j]) for j in prompts}

    run = Schedule(300, batch, seed, rule).run(reference, fetch)
    right = int(reference.sum())
    v = [sum(reference[j] and not table.correct[1, j] for b in fetched[:k] for j in b) for k in range(len(fetched) + 1)]
    seen = [sum(len(b) for b in fetched[:k]) for k in range(len(fetched) + 1)]
    for k in range(1, len(fetched)):  # undecided before each batch after the first
        assert rule.decide(v[k], right - seen[k]) is None
    assert run.stop == (rule.decide(v[-1], right - seen[-1]) if seen[-1] < right else None)
    assert (run.violations, run.unknown, run.ran) == (v[-1], right - seen[-1], tuple(j for b in fetched for j in b))


@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 200), batch=st.integers(1, 20), data=st.data())
def test_adaptive_order_visits_regressed_batches_first(seed: int, n: int, batch: int, data) -> None:
    """The adaptive order is a reordering of the seeded batches (same contents, so the same
    outcome keys), most earlier regressions first, ties in the seeded order; run() follows it."""
    rng = np.random.default_rng(seed)
    reference = rng.random(n) < 0.8
    right = [int(j) for j in np.flatnonzero(reference)]
    regressed = set(data.draw(st.lists(st.sampled_from(right), max_size=20))) if right else set()
    rule = StopRule(n, -1, n)  # never stops: every batch is visited
    seeded = Schedule(n, batch, seed, rule).batches(reference)
    schedule = Schedule(n, batch, seed, rule, adaptive=True)
    visiting = schedule.visiting(reference, regressed)
    assert sorted(visiting) == sorted(seeded) and all(list(b) == sorted(b) and len(b) <= batch for b in visiting)
    keys = [(-sum(j in regressed for j in b), seeded.index(b)) for b in visiting]
    assert keys == sorted(keys)
    fetched = []
    schedule.run(reference, lambda b: fetched.append(b) or {j: True for j in b}, regressed)
    assert fetched == visiting
    assert Schedule(n, batch, seed, rule).visiting(reference, regressed) == seeded  # adaptive off: the seeded order
    if not seeded:  # the reference answers nothing correctly: no batch to visit
        return
    # the prompts of any first k seeded batches are a seeded prefix; a visit that jumped ahead is not
    ran = np.zeros((2, n), dtype=bool)
    ran[0, [j for b in seeded[:len(seeded) // 2] for j in b]] = True
    ran[1, list(visiting[0])] = True
    assert seeded_prefix(schedule.order, reference, ran).tolist() == [True, visiting[0] == seeded[0]]


def test_adaptive_order_stops_sooner_on_shared_regressions() -> None:
    """Pinned: two candidates that regress on the same prompts; the second visits them first
    and stops (cannot be certified) after fewer prompts than the seeded order takes."""
    n = 200
    correct = np.ones((3, n), dtype=bool)
    correct[1:, 150:170] = False  # both candidates regress on the same 20 prompts
    table = OutcomeTable(("ref", "a", "b"), tuple(f"p{j}" for j in range(n)), correct, np.ones((3, n)), np.ones((3, n)))
    seeded, _, _ = simulate(table, 0.1, 16, 0, live=False)
    adaptive, stops, _ = simulate(table, 0.1, 16, 0, live=False, adaptive=True)
    assert stops == [None, CANNOT, CANNOT]
    assert adaptive[1].tolist() == seeded[1].tolist()  # the first candidate has no earlier regressions
    assert adaptive[2].sum() < seeded[2].sum()


# --------------------------------------------------------------------------- the certificate


@settings(max_examples=200)
@given(
    seed=st.integers(0, 2**32 - 1),
    m=st.integers(2, 6),
    n=st.integers(30, 400),
    alpha=st.sampled_from([0.02, 0.05, 0.1, 0.2, 0.3]),
    batch=st.sampled_from([1, 4, 16]),
    correction=st.sampled_from(["holm", "bonferroni"]),
    adaptive=st.booleans(),
)
@example(seed=0, m=2, n=60, alpha=0.1, batch=8, correction="holm", adaptive=False)
@example(seed=3, m=6, n=400, alpha=0.3, batch=1, correction="holm", adaptive=True)
@example(seed=11, m=6, n=30, alpha=0.3, batch=16, correction="bonferroni", adaptive=True)
@pytest.mark.slow  # a long schedule-equivalence search: 1.45 s CPU, over the inner loop's 50 s budget (issue 25)
def test_equivalent_valid_sets_scheduled_and_full(seed, m, n, alpha, batch, correction, adaptive) -> None:
    table = random_table(seed, m, n)
    assume(risk.critical_count(n, alpha, DELTA / m) >= 0)  # the gate refuses smaller n (calibration._check_n)
    assume(table.correct[0].any())  # else the gate runs the full grid (no candidate cost could be measured)
    options = dict(names=table.configs, correction=correction)
    full = risk.certify(table.correct, table.cost("tpf"), 0, alpha, DELTA, **options)
    ran, stops, rule = simulate(table, alpha, batch, seed, correction, adaptive=adaptive)

    live = certify_scheduled(table.correct, ran, stops, table.cost_on(ran, "tpf"), 0, rule, alpha, DELTA, **options,
                             order=seeded_order(n, seed))
    # only a stopped config can have biased estimates, and the seeded order never gives one
    assert not (live.biased & (np.array([s is None for s in stops]) | (not adaptive))).any()
    assert live.result.valid.tolist() == full.valid.tolist()
    assert live.result.deployed == full.deployed  # valid configs' costs are on all prompts, as in the full run
    rows = live.complete_rows
    assert rows[full.valid | (np.arange(m) == 0)].all()
    assert np.allclose(live.result.net_accuracy[rows], full.net_accuracy[rows], rtol=0, atol=1e-9)
    assert np.isnan(live.result.accuracy[~rows]).all()

    ran, stops, rule = simulate(table, alpha, batch, seed, correction, live=False, adaptive=adaptive)
    replayed = certify_scheduled(table.correct, ran, stops, table.cost("tpf"), 0, rule, alpha, DELTA,
                                 everything=table.correct, **options)
    assert replayed.result.valid.tolist() == full.valid.tolist()
    assert replayed.result.deployed == full.deployed
    assert replayed.result.net_accuracy.tolist() == full.net_accuracy.tolist()


def test_deployment_differs_on_prompts_run_costs() -> None:
    """Why valid candidates are decoded on the prompts they skipped: with costs on the
    prompts each ran on (the schedule alone), some seed deploys another config than the full
    run; the gate refuses to certify such a run."""
    for seed in range(400):
        table = random_table(seed, 4, 200)
        if not table.correct[0].any():
            continue
        full = risk.certify(table.correct, table.cost("tpf"), 0, 0.2, DELTA)
        ran, stops, rule = simulate(table, 0.2, 1, seed, live=False)
        if risk.select_deployed(full.valid, table.cost_on(ran, "tpf"), 0) != full.deployed_index:
            with pytest.raises(ValueError, match="is valid, so its cost decides the deployment, but it ran on"):
                certify_scheduled(table.correct, ran, stops, table.cost_on(ran, "tpf"), 0, rule, 0.2, DELTA)
            return
    pytest.fail("no seed in 0..399 reorders costs; the random tables lost their per-prompt costs")


def test_refuses_unconfirmed_stop() -> None:
    table = random_table(5, 3, 200)
    ran, stops, rule = simulate(table, 0.1, 4, 5)
    lying = np.array(ran)
    lying[1] = False
    lying[1, :8] = True  # claims config 1 stopped after 8 prompts
    with pytest.raises(ValueError, match="config 'c1' skipped .* reference-correct prompts, but its stop"):
        certify_scheduled(table.correct, lying, [None, CERTAIN, stops[2]], np.ones(3), 0, rule, 0.1, DELTA,
                          names=table.configs)


@given(seed=st.integers(0, 2**32 - 1), m=st.integers(1, 6), n=st.integers(1, 200), alpha=st.floats(0.01, 0.5))
def test_equivalent_certify_counts_certify(seed: int, m: int, n: int, alpha: float) -> None:
    table = random_table(seed, m, n)
    full = risk.certify(table.correct, table.cost("tpf"), 0, alpha, DELTA)
    counts = risk.certify_counts(risk.violations(table.correct, 0), n, table.cost("tpf"), 0, alpha, DELTA,
                                 accuracy=table.correct.mean(axis=1))
    assert redline_table.render(counts) == redline_table.render(full)
    assert counts.to_dict() == full.to_dict()


# --------------------------------------------------------------------------- the paper's grids


@pytest.mark.parametrize(("name", "low", "high"), [
    ("llada2_math", 0.6, 0.7), ("llada2_code", 0.5, 0.6), ("sdar_math", 0.5, 0.6), ("sdar_code", 0.35, 0.45),
])
def test_equivalent_valid_sets_published_grids(name: str, low: float, high: float) -> None:
    """alpha = 0.10, seed 0, batches of 16: the same verdict for 0.4x-0.7x of the naive forwards."""
    table, cost, reference = published_table(name)
    order = [table.index(reference)] + [i for i in range(table.m) if table.configs[i] != reference]
    table = table.select([table.configs[i] for i in order])  # the reference in row 0, as simulate expects
    full = risk.certify(table.correct, table.cost(cost), 0, 0.1, DELTA, names=table.configs)
    ran, stops, rule = simulate(table, 0.1, 16, 0, live=False)
    replayed = certify_scheduled(table.correct, ran, stops, table.cost(cost), 0, rule, 0.1, DELTA,
                                 everything=table.correct, names=table.configs)
    assert replayed.result.valid.tolist() == full.valid.tolist()
    assert replayed.result.deployed == full.deployed
    ratio = table.forwards[ran].sum() / table.forwards.sum()
    assert low <= ratio <= high
