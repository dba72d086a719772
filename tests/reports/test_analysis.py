"""The analyses: the paper's published figures, laws against naive per-split loops, the CLI.

Published figures (delta = 0.10, the reference counted in the Holm family), reproduced
from the vendored outcomes in tests/data/redline/ with the paper's full protocols.
"""
import json
from fractions import Fraction
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pytest_redline import cli, risk
from pytest_redline.lab import analysis
from pytest_redline.lab.analysis import GridData, Procedure
from pytest_redline.lab.commands import add_subcommands
from pytest_redline.outcomes import OutcomeTable
from published import DATA, GRIDS, published_table

VENDORED = [name for name, spec in GRIDS.items() if (DATA / spec["file"]).exists()]
LLADA2_MATH = ",".join(GRIDS["llada2_math"]["configs"])


@lru_cache(maxsize=None)
def grid_data(name):
    """A grid of grids.json as GridData (its configs, prompt filter and memory column applied)."""
    table, cost, reference = published_table(name)
    return GridData.from_table(table, reference, cost, label=name)


# --------------------------------------------------------------------------- published figures


def test_published_heldout_gain_llada2_math():
    result = analysis.heldout(grid_data("llada2_math"), 0.10)  # the paper's protocol, K = 1000
    gain, _ = result.config_spread("acc85/semi70")
    assert result.full_choice == "acc85/semi70"
    assert round(gain.mean, 1) == 37.6


@pytest.mark.slow  # bootstrap / analysis CLI over the published outcomes: 1.13 s CPU, over the inner loop's 50 s budget (issue 25)
def test_published_bootstrap_interval_llada2_math():
    result = analysis.intervals(grid_data("llada2_math"), 0.10)  # B = 10,000, seed 20260920
    assert result.deployed == "acc85/semi70"
    assert (round(result.gain_interval.low, 1), round(result.gain_interval.high, 1)) == (34.0, 41.1)
    assert result.gain_interval.low < result.gain < result.gain_interval.high
    ci = risk.clopper_pearson_interval(result.violations, result.n, 0.95)
    assert (result.risk_interval.low, result.risk_interval.high) == (ci.low, ci.high)


def test_published_mean_accuracy_below_redline_llada2_math():
    result = analysis.baselines(grid_data("llada2_math"), 0.10)  # the held-out splits, K = 1000
    redline = result.rule("redline").mean_gain
    for t in (0, 1, 2, 3, 4):
        assert result.rule(analysis.mean_accuracy_rule(t)).mean_gain < redline, t


@pytest.mark.slow  # eleven vendored grids: 2.2 s of CPU here
@pytest.mark.parametrize("name", VENDORED)
def test_within_delta_validity_vendored_grids(name):
    # Reduced split count (the full K = 1000 study is in benchmarks/bench_analysis.py).
    result = analysis.validity(grid_data(name), splits=300)
    assert not result.flagged.any(), str(result)
    # A split is uncovered only if the deployed config is valid with test risk above alpha.
    assert np.all(result.coverage >= 1 - result.fwer)


def test_published_sweep_llada2_math():
    result = analysis.sweep(grid_data("llada2_math"))
    j = list(result.alphas).index(0.10)
    assert result.alpha_min == 0.07
    assert (result.deployed[j], round(result.gain[j], 1), round(result.net_accuracy[j], 1)) == ("acc85/semi70", 37.5, -4.0)


# --------------------------------------------------------------------------- laws


def grid_of(correct, tokens, forwards):
    """GridData with config 0 as the reference and the tpf cost."""
    return GridData(
        names=tuple(f"c{i}" for i in range(len(correct))), reference=0, correct=np.asarray(correct, dtype=bool),
        cost=tokens.sum(1) / forwards.sum(1), cost_num=tokens, cost_den=forwards,
    )


@st.composite
def tables(draw, min_n=16, max_n=48):
    """Small random grids: config 0 is the reference; tokens and forwards are positive."""
    m = draw(st.integers(1, 5))
    n = draw(st.integers(min_n, max_n))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    correct = rng.random((m, n)) < rng.uniform(0.5, 1.0, size=(m, 1))
    return grid_of(correct, rng.integers(1, 60, size=(m, n)).astype(float), rng.integers(1, 20, size=(m, n)).astype(float))


def flat(correct_rows, n=32):
    """Pinned edge cases: every prompt alike; config i is correct everywhere or nowhere."""
    correct = np.repeat(np.array(correct_rows, dtype=bool)[:, None], n, axis=1)
    tokens = np.arange(1, len(correct_rows) + 1, dtype=float)[:, None] * np.ones((1, n))
    return grid_of(correct, tokens, np.ones_like(tokens))


NO_VIOLATIONS = flat([1, 1, 1])  # V = 0 for every config: ties everywhere
ALL_VIOLATE = flat([1, 0, 0])  # V = n for every candidate
ONLY_REFERENCE = flat([1])  # m = 1


procedures = st.builds(Procedure, delta=st.sampled_from([0.05, 0.1, 0.3]),
                       correction=st.sampled_from(["holm", "bonferroni"]), family=st.sampled_from(["all", "candidates"]))
budgets = st.sampled_from([0.01, 0.05, 0.1, 0.2, 0.3])


@settings(max_examples=25, deadline=None)
@given(grid=tables(), procedure=procedures, alpha=budgets, cal_fraction=st.sampled_from([0.3, 0.5, 0.7]),
       rank=st.sampled_from(["full", "calibration"]))
@example(grid=NO_VIOLATIONS, procedure=Procedure(), alpha=0.01, cal_fraction=0.5, rank="full")
@example(grid=ALL_VIOLATE, procedure=Procedure(), alpha=0.3, cal_fraction=0.3, rank="calibration")
@pytest.mark.slow  # bootstrap / analysis CLI over the published outcomes: 0.24 s CPU, over the inner loop's 50 s budget (issue 25)
def test_equivalent_heldout_per_split_certify(grid, procedure, alpha, cal_fraction, rank):
    """Each split of the vectorized held-out run is risk.certify on its calibration columns,
    ranked by the full-sample cost or by the calibration part's cost."""
    result = analysis.heldout(grid, alpha, procedure, splits=8, seed=3, cal_fraction=cal_fraction, rank=rank)
    n_cal = int(round(cal_fraction * grid.n))
    masks = analysis.calibration_mask(analysis.heldout_permutations(grid.n, 8, seed=3), n_cal)
    for s, cal in enumerate(masks):
        cal_cost = grid.cost_num[:, cal].sum(1) / grid.cost_den[:, cal].sum(1)
        ranking = grid.cost if rank == "full" else cal_cost
        certified = risk.certify(grid.correct[:, cal], ranking, 0, alpha, procedure.delta, **procedure.risk_options())
        d, test = certified.deployed_index, ~cal
        cost = grid.cost_num[:, test].sum(1) / grid.cost_den[:, test].sum(1)
        assert result.outcomes.deployed[s] == d
        assert result.outcomes.gain[s] == pytest.approx(100 * (cost[d] / cost[0] - 1))
        assert result.outcomes.net_accuracy[s] == pytest.approx(100 * (grid.correct[d, test].mean() - grid.correct[0, test].mean()))
        assert result.outcomes.test_risk[s] == pytest.approx(grid.joint[d, test].mean())


@settings(max_examples=25, deadline=None)
@given(grid=tables(), procedure=procedures)
@example(grid=NO_VIOLATIONS, procedure=Procedure())
@example(grid=ALL_VIOLATE, procedure=Procedure(family="candidates"))
@example(grid=ONLY_REFERENCE, procedure=Procedure(correction="bonferroni", family="candidates"))
@pytest.mark.slow  # bootstrap / analysis CLI over the published outcomes: 0.17 s CPU, over the inner loop's 50 s budget (issue 25)
def test_equivalent_valid_certify(grid, procedure):
    """Procedure.valid over (budgets, splits) is risk.certify's valid mask, one split at a time."""
    alphas = [0.02, 0.1, 0.25]
    masks = analysis.calibration_mask(analysis.validity_permutations(grid.n, 5), grid.n // 2)
    v = np.stack([risk.violations(grid.correct[:, cal], 0) for cal in masks])
    valid = procedure.valid(v, grid.n // 2, alphas, 0)
    for a, alpha in enumerate(alphas):
        for s, cal in enumerate(masks):
            expected = risk.certify(grid.correct[:, cal], grid.cost, 0, alpha, procedure.delta, **procedure.risk_options())
            assert valid[a, s].tolist() == expected.valid.tolist()


@settings(max_examples=25, deadline=None)
@given(grid=tables(), delta=st.sampled_from([0.05, 0.1, 0.3]))
def test_equivalent_uncorrected_binom_pvalue(grid, delta):
    """Without correction, a config is valid exactly when its own p-value is at most delta."""
    v = risk.violations(grid.correct, 0)[None, :]
    valid = Procedure(delta, "none").valid(v, grid.n, [0.1], 0)[0, 0]
    assert valid.tolist() == (risk.binom_pvalue(v[0], grid.n, 0.1) <= delta).tolist()


@settings(max_examples=20, deadline=None)
@given(grid=tables(min_n=40, max_n=80), alpha=budgets)
def test_equivalent_baselines_naive_rules(grid, alpha):
    """Mean-accuracy and plug-in rules against a per-split loop in exact fractions."""
    result = analysis.baselines(grid, alpha, splits=6, seed=11, tolerances=(0, 2, 5))
    n_cal = int(round(0.5 * grid.n))
    masks = analysis.calibration_mask(analysis.heldout_permutations(grid.n, 6, seed=11), n_cal)
    a = Fraction(str(alpha))

    def fastest(allowed):
        allowed[0] = True
        return max(np.flatnonzero(allowed), key=lambda i: (grid.cost[i], -i))

    for s, cal in enumerate(masks):
        acc = [Fraction(int(c.sum()), n_cal) for c in grid.correct[:, cal]]
        for t in (0, 2, 5):
            within = np.array([acc[i] >= acc[0] - Fraction(t, 100) for i in range(grid.m)])
            assert result.rule(analysis.mean_accuracy_rule(t)).deployed[s] == fastest(within)
        plug_in = np.array([Fraction(int(j.sum()), n_cal) <= a for j in grid.joint[:, cal]])
        assert result.rule(analysis.PLUG_IN).deployed[s] == fastest(plug_in)


@settings(max_examples=20, deadline=None)
@given(grid=tables(min_n=30, max_n=60), procedure=procedures)
def test_equivalent_validity_per_split_loop(grid, procedure):
    """FWER, pooled FWER and coverage of the vectorized study against a loop over splits."""
    alphas, sizes, splits = [0.05, 0.15], [15, grid.n - 15], 6
    result = analysis.validity(grid, alphas, sizes, splits, procedure)
    perms = analysis.validity_permutations(grid.n, splits)
    pooled = grid.joint.mean(1)
    for s, n_cal in enumerate(sorted(set(sizes))):
        for a, alpha in enumerate(alphas):
            fwer = pool = cover = 0
            for perm in perms:
                cal, test = perm[:n_cal], perm[n_cal:]
                r = risk.certify(grid.correct[:, cal], grid.cost, 0, alpha, procedure.delta, **procedure.risk_options())
                test_risk = grid.joint[:, test].mean(1)
                fwer += bool(np.any(r.valid & (test_risk > alpha)))
                pool += bool(np.any(r.valid & (pooled > alpha)))
                cover += bool(test_risk[r.deployed_index] <= alpha)
            assert result.fwer[s, a] == fwer / splits
            assert result.fwer_pooled[s, a] == pool / splits
            assert result.coverage[s, a] == cover / splits


@settings(max_examples=25, deadline=None)
@given(grid=tables(), procedure=procedures)
def test_monotone_sweep_gain(grid, procedure):
    """Holm and Bonferroni are monotone in the p-values, which fall as alpha grows: gain never drops."""
    result = analysis.sweep(grid, risk.DEFAULT_ALPHAS, procedure)
    assert np.all(np.diff(result.gain) >= 0)


@pytest.mark.parametrize("kind, column", [("tpf", None), ("apf", None), ("memory_gb", "memory_gb")])
def test_equivalent_weighted_cost_table_cost(kind, column):
    """Unit weights give the full-sample cost of OutcomeTable.cost, for every cost kind."""
    table = OutcomeTable.read_csv(DATA / "specdec_qwen_gsm8k.csv")
    if column:
        table = table.with_column(column, np.linspace(16.0, 4.0, table.m))
    grid = GridData.from_table(table, "lossless", kind)
    assert grid.weighted_cost(np.ones((1, grid.n)))[0] == pytest.approx(table.cost(kind), rel=1e-12)
    assert grid.lower_is_better == (kind == "memory_gb")


def test_identity_bootstrap_weights_protocol():
    w = analysis.bootstrap_weights(50, 7, seed=5)
    expected = np.random.default_rng(5).multinomial(50, [1 / 50] * 50, size=7)
    assert np.array_equal(w, expected) and np.all(w.sum(1) == 50)


def test_identity_heldout_permutations_protocol():
    rng = np.random.default_rng(20260918)
    expected = [rng.permutation(30) for _ in range(4)]
    assert np.array_equal(analysis.heldout_permutations(30, 4), np.stack(expected))
    mask = analysis.calibration_mask(analysis.heldout_permutations(30, 4), 15)
    assert np.array_equal(np.flatnonzero(mask[2]), np.sort(expected[2][:15]))


def test_paper_calibration_sizes():
    assert analysis.calibration_sizes(1012) == (25, 50, 100, 200, 506)
    assert analysis.calibration_sizes(164) == (25, 50, 82, 100)  # 200 > 164 - 15 is dropped


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda g: analysis.heldout(g, 0.1, cal_fraction=1e-4), r"cal_fraction \(0.0001\) must leave at least one prompt"),
        (lambda g: analysis.heldout(g, 0.1, splits=0), r"splits \(0\) must be an integer >= 1"),
        (lambda g: analysis.heldout(g, 0.1, rank="test"), r"rank \('test'\) not recognized"),
        (lambda g: analysis.baselines(g, 0.1, tolerances=(-1,)), r"tolerances \(\[-1\]\) must be accuracy points >= 0"),
        (lambda g: analysis.validity(g, sizes=(5000,)), r"llada2_math: sizes \(\[5000\]\): no calibration size in \[15, 997\]"),
        (lambda g: analysis.intervals(g, 0.1, confidence=1.5), r"confidence \(1.5\) must be in the open interval"),
        (lambda g: Procedure(delta=0.0), r"delta \(0.0\) must be in the open interval"),
        (lambda g: Procedure(correction="bh"), r"correction \('bh'\) not recognized"),
    ],
)
def test_bad_input_names_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call(grid_data("llada2_math"))


def test_bad_input_empty_cost_column_names_file():
    table = OutcomeTable.read_csv(DATA / "quant_llama_gsm8k.csv")
    with pytest.raises(ValueError, match=r"quant_llama_gsm8k.csv: cost 'tpf' needs column 'forwards'"):
        GridData.from_table(table, "bf16", "tpf")


# --------------------------------------------------------------------------- command line


@pytest.fixture
def redline(monkeypatch, capsys):
    """Run ``redline ARGS`` with the analyses wired in as cli.py will; returns (status, stdout, stderr)."""
    if add_subcommands not in cli.SUBCOMMANDS:
        monkeypatch.setattr(cli, "SUBCOMMANDS", [*cli.SUBCOMMANDS, add_subcommands])

    def run(*args):
        status = cli.main([str(a) for a in args])
        out, err = capsys.readouterr()
        return status, out, err

    return run


def test_cli_sweep_json_several_grids(redline):
    status, out, _ = redline(
        "sweep", DATA / "llada2_math.csv", DATA / "llada2_code.csv", "--reference", "acc95/semi90",
        "--alphas", "0.05:0.20:0.05", "--json",
    )
    grids = json.loads(out)["grids"]
    assert status == 0 and [g["grid"] for g in grids] == ["llada2_math", "llada2_code"]
    assert [a["alpha"] for a in grids[1]["alphas"]] == [0.05, 0.1, 0.15, 0.2]
    assert grids[1]["alpha_min"] == 0.15 and grids[1]["alphas"][2]["deployed"] == "acc85/semi90"


@pytest.mark.slow  # bootstrap / analysis CLI over the published outcomes: 0.32 s CPU, over the inner loop's 50 s budget (issue 25)
def test_cli_heldout_json(redline):
    status, out, _ = redline(
        "heldout", DATA / "llada2_math.csv", "--reference", "acc95/semi90", "--configs", LLADA2_MATH,
        "--alpha", "0.1", "--splits", "100", "--json",
    )
    report = json.loads(out)
    assert status == 0 and report["splits"] == 100 and report["cal_size"] == 506
    assert sum(c["deployed"] for c in report["configs"]) == 100
    assert set(report) >= {"gain", "net_accuracy_points", "exceedance", "exceedance_pooled", "full_choice"}


@pytest.mark.slow  # bootstrap / analysis CLI over the published outcomes: 0.33 s CPU, over the inner loop's 50 s budget (issue 25)
def test_cli_baselines_text(redline):
    status, out, _ = redline(
        "baselines", DATA / "llada2_math.csv", "--reference", "acc95/semi90", "--configs", LLADA2_MATH,
        "--alpha", "0.1", "--splits", "50", "--tolerances", "0,4",
    )
    assert status == 0
    assert [line.split("  ")[0] for line in out.splitlines()[2:]] == [
        "redline", "mean-accuracy 0 pts", "mean-accuracy 4 pts", analysis.PLUG_IN, analysis.UNCORRECTED,
    ]


def test_cli_intervals_json(redline):
    status, out, _ = redline(
        "intervals", DATA / "llada2_math.csv", "--reference", "acc95/semi90", "--configs", LLADA2_MATH,
        "--alpha", "0.1", "--boot", "500", "--json",
    )
    report = json.loads(out)
    assert status == 0 and report["deployed"] == "acc85/semi70" and report["boot"] == 500
    assert report["gain_interval"][0] < report["gain"] < report["gain_interval"][1]


@pytest.mark.slow  # bootstrap / analysis CLI over the published outcomes: 0.26 s CPU, over the inner loop's 50 s budget (issue 25)
def test_cli_validity_exit_status(redline, tmp_path):
    """0 within delta; 1 when a combination is flagged (here: a config whose test-part risk
    runs against its calibration count, on 60 prompts)."""
    status, out, _ = redline("validity", DATA / "llada2_math.csv", "--reference", "acc95/semi90", "--splits", "50", "--json")
    assert status == 0 and json.loads(out)["flagged"] == 0
    rows = ["config,prompt,correct,tokens,forwards"]
    rows += [f"ref,p{j},1,10,10" for j in range(60)] + [f"fast,p{j},{int(j >= 5)},10,5" for j in range(60)]
    (tmp_path / "edge.csv").write_text("\n".join(rows) + "\n")
    status, out, _ = redline(
        "validity", tmp_path / "edge.csv", "--reference", "ref", "--sizes", "30", "--alphas", "0.1", "--delta", "0.2", "--splits", "200",
    )
    assert status == 1 and "1 combination(s) exceed delta" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["sweep", DATA / "llada2_math.csv", "--reference", "nope"], "llada2_math.csv: reference 'nope' is not among the configs"),
        (["sweep", DATA / "llada2_math.csv", DATA / "llada2_code.csv", "--reference", "a,b,c"], "expected one name or one per file (2 files)"),
        (["sweep", DATA / "llada2_math.csv", "--reference", "acc95/semi90", "--alphas", "0.1:0.01:0.01"], "argument --alphas: expected START:STOP:STEP"),
        (["heldout", DATA / "llada2_math.csv", "--reference", "acc95/semi90", "--alpha", "0.1", "--seed", "-1"], "argument --seed: expected an integer >= 0"),
        (["baselines", DATA / "llada2_math.csv", "--reference", "acc95/semi90", "--alpha", "0.1", "--plot", "x.pdf"], "argument --plot: expected a .png path"),
        (["validity", DATA / "llada2_math.csv", "--reference", "acc95/semi90", "--sizes", "10,x"], "argument --sizes: expected comma-separated sizes"),
        (["intervals", DATA / "quant_llama_gsm8k.csv", "--reference", "bf16", "--alpha", "0.1"], "cost 'tpf' needs column 'forwards'"),
    ],
)
def test_cli_bad_input_one_line(redline, args, message):
    status, out, err = redline(*args)
    assert status == 4 and out == ""
    assert len(err.splitlines()) == 1 and message in err
