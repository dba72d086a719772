"""The three statuses, min_gain, the trade-off flag and the preflight, through the gate (pytester,
the fake engine of redline_fakes: ``ref`` 10 forwards per prompt and always right, ``fast`` 5
forwards and wrong on q3, ``rash`` 2 forwards and wrong on every 4th prompt; cost tpf = 10 /
forwards)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from redline_fakes import Project
from terminal_text import flat
from scipy import stats

from pytest_redline import preflight

pytest_plugins = ["pytester"]

ALPHA = "--redline-alpha=0.1"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(pytester: pytest.Pytester) -> Project:
    return Project(pytester)


def _configs(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["configs"]}


@pytest.mark.slow  # in-process pytester gate run(s): 0.17 s CPU, over the inner loop's 50 s budget (issue 25)
def test_full_run_statuses_in_the_table_and_json(project: Project) -> None:
    project.grid()
    result = project.run(ALPHA, "--redline-full", "--redline-report=report.json")
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "*fast*valid*certified*",
        "*rash*NOT valid*exceeds budget*",
    ])
    assert ("exceeds budget (risk > alpha shown: P[Bin(n, alpha) >= V], holm over the 2 candidates) / inconclusive; each "
            "family errs with probability <= 0.1, any status is wrong with probability <= 0.2") in flat(result)
    report = project.report()
    configs = _configs(report)
    assert {name: c["status"] for name, c in configs.items()} == {
        "ref": "certified", "fast": "certified", "rash": "exceeds budget"}
    p = stats.binomtest(15, 60, 0.1, alternative="greater").pvalue
    assert configs["rash"]["reverse"]["violations"] == 15
    assert configs["rash"]["reverse"]["p_value"] == pytest.approx(p, rel=1e-9)
    assert configs["rash"]["reverse"]["p_adjusted"] == pytest.approx(2 * p, rel=1e-9)  # Holm over 2 candidates, smallest
    assert report["statuses"]["family_level"] == 0.1 and report["statuses"]["lower_bounds"] is False
    assert report["min_gain"] == 0 and report["deployed"] == "fast"


@pytest.mark.slow  # in-process pytester gate run(s): 0.21 s CPU, over the inner loop's 50 s budget (issue 25)
def test_inconclusive_config_says_what_would_settle_it(project: Project) -> None:
    from pytest_redline.planning import prompts_needed
    from pytest_redline.planning import reverse_prompts_needed

    configs = ("configs:\n  ref: {forwards: 10}\n  near: {forwards: 5, wrong_every: 12}\n"
               "  over: {forwards: 4, wrong_every: 8}\n  edge: {forwards: 8, wrong_every: 10}")
    project.grid(configs="DROP")
    (project.path / "redline.yaml").write_text((project.path / "redline.yaml").read_text() + configs + "\n")
    result = project.run(ALPHA, "--redline-full", "--redline-report=report.json")
    entries = _configs(project.report())
    # near: V = 5 of 60 (risk 0.083 < 0.1), over: V = 7 (0.117 > 0.1), edge: V = 6 (risk = alpha)
    assert [entries[c]["status"] for c in ("near", "over", "edge")] == ["inconclusive"] * 3
    assert entries["near"]["to_settle"] == {"test": "certify", "risk": 5 / 60, "over": None,
                                            "prompts": prompts_needed(0.1, 5 / 60, 4, 0.1, power=0.8)}
    assert entries["over"]["to_settle"]["prompts"] == reverse_prompts_needed(0.1, 7 / 60, 4, 0.1, power=0.8)
    assert entries["edge"]["to_settle"] == {"test": "none", "risk": 0.1, "prompts": None, "over": None}
    result.stdout.fnmatch_lines(["*over*inconclusive*", "*edge*inconclusive*", "notes:",
                                 "  over: *n=* prompts would show it exceeds the budget with 80% power*",
                                 "  edge: *no n settles it (risk 0.1000 = alpha)"])


def test_scheduled_run_tests_the_counts_it_reached(project: Project) -> None:
    """rash stops early (cannot be certified): its reverse test uses the V counted on the prompts
    it ran on, a lower bound, and the report says a scheduled run may be inconclusive there."""
    project.grid()
    result = project.run(ALPHA, "--redline-report=report.json")
    report = project.report()
    rash = _configs(report)["rash"]
    assert rash["stopped"] == "cannot be certified" and rash["prompts_run"] < 60
    seen = sum(1 for p in rash["ran_on"] if int(p[1:]) % 4 == 3)
    assert rash["reverse"]["violations"] == seen < 15
    assert report["statuses"]["lower_bounds"] is True
    assert rash["status"] in ("exceeds budget", "inconclusive")
    assert "may say inconclusive where --redline-full says exceeds budget" in flat(result)


@pytest.mark.slow  # in-process pytester gate run(s): 0.69 s CPU, over the inner loop's 50 s budget (issue 25)
def test_min_gain_changes_only_the_choice(project: Project) -> None:
    project.grid(min_gain="150")  # fast gains +100 %: valid, but not enough
    project.run(ALPHA, "--redline-full", "--redline-report=report.json")
    report = project.report()
    assert (report["min_gain"], report["deployed"]) == (150, "ref")
    assert _configs(report)["fast"]["valid"] and _configs(report)["fast"]["status"] == "certified"
    project.grid(min_gain="100")
    result = project.run(ALPHA, "--redline-full", "--redline-report=report.json")
    assert project.report()["deployed"] == "fast"
    result.stdout.fnmatch_lines(["min_gain: a deployed candidate must gain at least 100% tpf"])


@pytest.mark.slow  # in-process pytester gate run(s): 0.56 s CPU, over the inner loop's 50 s budget (issue 25)
def test_min_gain_applies_in_select_mode_only(project: Project) -> None:
    project.grid(min_gain="150", deploy="fast")
    result = project.run(ALPHA, "--redline-full", "--redline-report=report.json")
    assert result.ret == 0 and project.report()["deployed"] == "fast"
    result.stdout.fnmatch_lines(["*not applied: it applies in select mode only, this is gate*"])


@pytest.mark.parametrize("value, message", [
    ("-1", "expected a gain in percent of the reference's tpf >= 0"), ("lots", "got 'lots' (str)"), ("yes", "got True (bool)")])
def test_min_gain_is_checked(project: Project, value: str, message: str) -> None:
    project.grid(min_gain=value)
    result = project.run(ALPHA)
    assert result.ret == 4
    result.stderr.fnmatch_lines([f"*redline.yaml: min_gain: *{message}*"])


def test_min_gain_of_a_memory_grid_is_a_factor(project: Project) -> None:
    project.grid(cost="memory_gb", direction="lower", min_gain="0.5")
    result = project.run(ALPHA)
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*min_gain: expected a reduction factor >= 1*"])


POOR = "configs:\n  ref: {forwards: 10}\n  lossy: {forwards: 9.8, wrong_every: 25}\n"


@pytest.mark.slow  # in-process pytester gate run(s): 0.29 s CPU, over the inner loop's 50 s budget (issue 25)
def test_poor_trade_is_flagged(project: Project) -> None:
    """lossy: +2.0 % tpf for 4 accuracy points (8 of 200 prompts): deployed and flagged."""
    project.grid(configs="DROP", suite_args="{n: 200}")
    (project.path / "redline.yaml").write_text((project.path / "redline.yaml").read_text() + POOR)
    result = project.run(ALPHA, "--redline-full", "--redline-report=report.json")
    report = project.report()
    assert report["deployed"] == "lossy"
    assert report["poor_trade"] == ("poor trade: lossy gives up 4.0 accuracy points for +2.0% tpf "
                                    "(more points lost than percent gained)")
    result.stdout.fnmatch_lines(["poor trade: lossy gives up 4.0 accuracy points for +2.0% tpf*"])


@pytest.mark.slow  # in-process pytester gate run(s): 0.21 s CPU, over the inner loop's 50 s budget (issue 25)
def test_fair_trade_and_memory_are_not_flagged(project: Project) -> None:
    project.grid()
    project.run(ALPHA, "--redline-full", "--redline-report=report.json")
    assert project.report()["poor_trade"] is None  # fast: +100 % for 1.7 points


def test_gate_says_a_certified_config_is_slower(project: Project) -> None:
    project.grid(configs="DROP", deploy="slow")
    text = (project.path / "redline.yaml").read_text()
    (project.path / "redline.yaml").write_text(text + "configs:\n  ref: {forwards: 10}\n  slow: {forwards: 12.5}\n")
    result = project.run(ALPHA, "--redline-full", "--redline-report=report.json")
    assert result.ret == 0
    report = project.report()
    assert report["requested"] == "slow" and report["certified"] and report["slower_than_reference"]
    result.stdout.fnmatch_lines(["note: slow is certified but slower than the reference ref on tpf (-20.0%); "
                                 "it is still the requested config"])


# --------------------------------------------------------------------------- preflight


def test_plan_figures_are_scipys() -> None:
    cal = SimpleNamespace(alpha=0.1, alpha_source="--redline-alpha", n=300, m=5, delta_share=0.1, grid=SimpleNamespace(name="g"))
    plan = preflight.plan(cal)
    step = 0.1 / 5
    k = int(np.flatnonzero(stats.binom.cdf(np.arange(301), 300, 0.1) <= step)[-1])
    assert plan.power == pytest.approx((stats.binom.cdf(k, 300, 0.05), stats.binom.cdf(k, 300, 0.025)), rel=1e-9)
    from pytest_redline.planning import prompts_needed

    assert plan.needed == (prompts_needed(0.1, 0.05, 5, 0.1), prompts_needed(0.1, 0.025, 5, 0.1))
    assert preflight.weak_power(cal) is None
    small = SimpleNamespace(alpha=0.1, alpha_source="--redline-alpha", n=60, m=3, delta_share=0.1, grid=SimpleNamespace(name="g"))
    weak = preflight.plan(small)
    assert weak.power[0] < 0.5 and preflight.weak_power(small) == (
        f"redline warning: g: with n=60 prompts a config at risk alpha/2 = 0.05 is certified with probability "
        f"{weak.power[0]:.2f} (< 50%); {weak.needed[0]} prompts give 80%")
    assert preflight.lines([weak])[-1] == preflight.weak_power(small)


def test_plan_prints_and_decodes_nothing(project: Project) -> None:
    project.grid()
    result = project.run(ALPHA, "--redline-plan")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["redline plan: alpha=0.1; no model loaded, nothing decoded",
                                 "grid*n*m*level*step*power a/2*power a/4*n80 a/2*n80 a/4",
                                 "fake-grid*60*3*0.1*0.03333*",
                                 "redline warning: fake-grid: with n=60 prompts*"])
    assert project.calls() == [] and not (project.path / ".redline").exists()
    assert "collected" not in result.stdout.str()


def test_plan_needs_alpha_and_a_good_grid(project: Project) -> None:
    project.grid(min_gain="-3")
    assert project.run("--redline-plan").ret == 4
    assert project.run(ALPHA, "--redline-plan").ret == 4


@pytest.mark.slow  # in-process pytester gate run(s): 0.18 s CPU, over the inner loop's 50 s budget (issue 25)
def test_gate_warns_at_the_start_when_power_is_low(project: Project) -> None:
    project.grid()
    result = project.run(ALPHA, "--redline-full")
    lines = result.stdout.lines
    warning = next(i for i, line in enumerate(lines) if line.startswith("redline warning: fake-grid"))
    assert warning < next(i for i, line in enumerate(lines) if line.startswith("redline.yaml"))


@pytest.mark.slow  # a subprocess pytest
def test_plan_imports_no_torch() -> None:
    """The embedded grid (block_diffusion) and the speculative grid (transformers models): the
    preflight runs with torch blocked, and neither torch nor transformers is imported."""
    script = (
        "import sys\n"
        "sys.modules['torch'] = None\n"  # any import of torch now raises
        "import pytest\n"
        "code = pytest.main(['-p', 'no:cacheprovider', '--redline-alpha=0.1', '--redline-plan', "
        "'--redline-grid=redline.yaml', '--redline-grid=grids/speculative.yaml'])\n"
        "print('HEAVY', sorted(m for m in sys.modules if m.split('.')[0] in ('transformers', 'bitsandbytes')))\n"
        "sys.exit(code)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "HEAVY []" in run.stdout
    assert re.search(r"^arithmetic-tiny +[\d.]+ \(--redline-alpha\) +512 +12 ", run.stdout, re.M)
    assert re.search(r"^speculative-arithmetic +[\d.]+ \(--redline-alpha\) +512 +7 ", run.stdout, re.M)


def test_published_llada2_statuses_from_the_outcome_table() -> None:
    """The replayed grid's statuses at alpha = 0.05, from the published table (exact V of every config)."""
    from pytest_redline import risk
    from pytest_redline.outcomes import OutcomeTable

    table = OutcomeTable.read_csv(ROOT / "tests/data/redline/llada2_math.csv")
    names = ("acc85/semi70", "acc85/semi90", "acc90/semi70", "acc90/semi90", "acc95/semi70", "acc95/semi90", "acc99/semi90")
    correct = table.correct[[table.index(c) for c in names]]
    result = risk.certify(correct, np.ones(7), 5, 0.05, 0.1, names=names)
    rev = risk.exceeds_budget(result.violations, correct.shape[1], 5, 0.05, 0.1)
    assert result.violations.tolist() == [73, 67, 65, 54, 52, 0, 40]
    assert risk.statuses(result.valid, rev.exceeds) == (
        "exceeds budget", "exceeds budget", "inconclusive", "inconclusive", "inconclusive", "certified", "inconclusive")


@pytest.mark.slow  # the replayed grid: 7,084 items through pytest (~20 s under load)
def test_published_llada2_replay_gives_every_config_a_status(project: Project) -> None:
    grid = ROOT / "grids" / "llada2_math_published.yaml"
    result = project.run("--redline-alpha=0.05", f"--redline-grid={grid}", "--redline-report=report.json")
    assert result.ret == 0
    statuses = {c["name"]: c["status"] for c in project.report()["configs"]}
    assert statuses == {"acc85/semi70": "exceeds budget", "acc85/semi90": "exceeds budget",
                        "acc90/semi70": "inconclusive", "acc90/semi90": "inconclusive", "acc95/semi70": "inconclusive",
                        "acc95/semi90": "certified", "acc99/semi90": "inconclusive"}
