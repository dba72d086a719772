"""Declared cost bounds through the gate: a bound that lies makes the run partial, a memory grid
with declared constants decodes no contender, and scheduled runs deploy what --redline-full does
while decoding less (fakes: tests/support/redline_fakes)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from redline_fakes import Project
from tests.risk.test_schedule import random_table

from pytest_redline.outcomes import OutcomeTable

pytest_plugins = ["pytester"]

ALPHA = "--redline-alpha=0.1"


@pytest.fixture
def project(pytester: pytest.Pytester) -> Project:
    return Project(pytester)


def by_name(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["configs"]}


@pytest.mark.slow  # in-process pytester gate run(s): 0.22 s CPU, over the inner loop's 50 s budget (issue 25)
def test_bound_that_lies_makes_the_run_partial(project: Project) -> None:
    project.grid(configs="{ref: {forwards: 10}, fast: {forwards: 5, wrong: [q3], bounds: {forwards: [1, 4], tokens: [0, 10]}}}")
    result = project.run(ALPHA, "--redline-report=report.json")
    assert result.ret == 1
    result.stdout.fnmatch_lines([
        "*engine 'fake' broke its declared cost bounds on config 'fast', prompt 'q*': forwards = 5 outside the declared [[]1, 4[]]*",
        "*PARTIAL RUN*",
    ])
    assert project.report()["certified"] is False


MEMORY = """\
name: memory-grid
suite: fake
suite_args: {n: 60}
engine: fake
engine_args: {log_path: calls.jsonl}
cost: memory_gb
direction: lower
reference: ref
batch_size: 8
configs:
  ref: {memory_gb: 4.0, wrong: [q1, q2, q9, q20, q33, q41, q50, q58], bounds: {memory_gb: constant}}
  half: {memory_gb: 2.0, wrong: [q3], bounds: {memory_gb: constant}}
  rash: {memory_gb: 1.0, wrong_every: 4, bounds: {memory_gb: constant}}
  third: {memory_gb: 1.5, wrong: [q7], bounds: {memory_gb: constant}}
deploy: fastest
"""


def decoded(project: Project) -> int:
    return sum(len(call["prompts"]) for call in project.calls())


@pytest.mark.slow  # in-process pytester gate run(s): 0.43 s CPU, over the inner loop's 50 s budget (issue 25)
def test_memory_grid_with_declared_constants_decodes_no_contender(project: Project) -> None:
    project.grid(MEMORY)
    full = project.run(ALPHA, "--redline-full", "--redline-no-cache", "--redline-report=full.json")
    assert full.ret == 0
    full_decoded = decoded(project)
    (project.path / "calls.jsonl").unlink()
    scheduled = project.run(ALPHA, "--redline-no-cache", "--redline-report=scheduled.json")
    assert scheduled.ret == 0
    one, two = project.report("full.json"), project.report("scheduled.json")
    assert [c["valid"] for c in one["configs"]] == [c["valid"] for c in two["configs"]]
    assert one["deployed"] == two["deployed"] == "third"
    assert by_name(two)["third"]["cost"] == pytest.approx(1.5)
    # the contenders ran their schedules only: no prompt decoded for cost beyond them
    calls = project.calls()
    assert full_decoded == 240
    assert decoded(project) == 240 - 3 * 8 - two["schedule"]["skipped"]["early_stop"]  # nothing where the reference is wrong
    assert all(not set(c["prompts"]) & {"q1", "q2", "q9"} for c in calls if c["config"]["memory_gb"] != 4.0)
    assert by_name(two)["half"]["valid"] and by_name(two)["half"]["prompts_run"] == 52


def banded_table(seed: int, m: int, n: int):
    """A random table whose configs' per-prompt costs lie in bands of their own (what bounds
    separate): a reference (row 0) wrong on some prompts, candidates with assorted risks."""
    rng = np.random.default_rng(seed)
    base = random_table(seed, m, n)
    forwards = rng.integers(5, 12, size=(m, n)).astype(float)
    rate = rng.uniform(1.0, 4.0, size=(m, 1))
    tokens = np.floor(forwards * (rate + rng.uniform(0.0, rng.choice([0.05, 0.5]), size=(m, n))))
    memory = np.repeat(rng.integers(1, 9, size=(m, 1)).astype(float), n, axis=1)
    return OutcomeTable(base.configs, base.prompts, base.correct, tokens, forwards, {"memory_gb": memory})


def live_grid(project: Project, m: int, cost: str, bounds: bool, filename: str) -> None:
    names = ", ".join(f"c{i}: {{config: c{i}}}" for i in range(m))
    project.grid(f"name: live\nsuite: table\nsuite_args: {{outcomes: table.csv}}\nengine: table\n"
                 f"engine_args: {{outcomes: table.csv, bounds: {str(bounds).lower()}}}\ncost: {cost}\n"
                 f"{'direction: lower' + chr(10) if cost == 'memory_gb' else ''}reference: c0\nbatch_size: 8\n"
                 f"configs: {{{names}}}\ndeploy: fastest\n", filename=filename)


@pytest.mark.slow  # three gates per example, over 5 s in all
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(2, 5), n=st.integers(60, 160), alpha=st.sampled_from([0.1, 0.2]),
       cost=st.sampled_from(["tpf", "apf", "memory_gb"]))
@example(seed=3, m=5, n=160, alpha=0.2, cost="tpf")  # the bounds save decoding here (asserted below)
def test_bounded_scheduled_run_deploys_what_full_run_does(project: Project, seed, m, n, alpha, cost) -> None:
    """Random tables served live with true declared bounds: scheduled (bounds on), scheduled
    (bounds off) and --redline-full give the same valid set and deployed config, and the
    bounds never decode more than the rule without them."""
    banded_table(seed, m, n).write_csv(project.path / "table.csv")
    live_grid(project, m, cost, True, "bounded.yaml")
    live_grid(project, m, cost, False, "unbounded.yaml")
    common = ("--redline-no-cache", f"--redline-alpha={alpha}")
    assert project.run("--redline-grid=bounded.yaml", *common, "--redline-full", "--redline-report=full.json").ret == 0
    assert project.run("--redline-grid=bounded.yaml", *common, "--redline-report=bounded.json").ret == 0
    assert project.run("--redline-grid=unbounded.yaml", *common, "--redline-report=unbounded.json").ret == 0
    full, bounded, unbounded = (project.report(f"{name}.json") for name in ("full", "bounded", "unbounded"))
    assert [c["valid"] for c in bounded["configs"]] == [c["valid"] for c in full["configs"]]
    assert bounded["deployed"] == full["deployed"] == unbounded["deployed"]
    deployed = by_name(bounded)[bounded["deployed"]]
    assert deployed["cost"] == pytest.approx(by_name(full)[full["deployed"]]["cost"])
    spent = {name: report["outcomes"]["decoded"] for name, report in (("bounded", bounded), ("unbounded", unbounded))}
    assert spent["bounded"] <= spent["unbounded"]
    for entry in bounded["configs"]:  # a settled contender's interval holds its true all-prompt cost
        if entry.get("cost_interval"):
            low, high = (x if x is not None else float("nan") for x in entry["cost_interval"])
            true = by_name(full)[entry["name"]]["cost"]
            assert not low > true * (1 + 1e-12) and not high < true * (1 - 1e-12)
    if (seed, m, n, alpha, cost) == (3, 5, 160, 0.2, "tpf"):
        assert spent["bounded"] < spent["unbounded"]


def test_gate_mode_decodes_only_the_named_config_for_cost(project: Project) -> None:
    bounds = "bounds: {tokens: [10, 10], forwards: [1, 10], tokens_per_forward: [1, 10]}"
    project.grid(configs=f"{{ref: {{forwards: 10, wrong: [q1, q2, q40], {bounds}}}, fast: {{forwards: 5, wrong: [q3], {bounds}}}, "
                         f"also: {{forwards: 4, wrong: [q5], {bounds}}}}}", deploy="fast")
    result = project.run(ALPHA, "--redline-report=report.json", "--redline-html=review.html")
    assert result.ret == 0
    report = project.report()
    configs = by_name(report)
    assert (configs["fast"]["prompts_run"], configs["also"]["prompts_run"]) == (60, 57)
    assert configs["fast"]["cost"] == 2.0 and "cost_interval" not in configs["fast"]
    also = configs["also"]
    assert also["cost"] is None and also["cost_decided"] == "gate mode: decoded for the verdict only"
    assert also["cost_interval"] == [pytest.approx(600 / 258), pytest.approx(600 / 231)]  # 3 prompts left: 10 tokens in 1 to 10 forwards
    assert report["best_valid_open"] == ["also"]
    result.stdout.fnmatch_lines(["*also*valid*certified*[[]2.326, 2.597[]]*[[]+132.6, +159.7[]]%*",
                                 "hint: the best-cost valid config is fast or also (valid, not decoded for cost in gate mode*"])
    assert "fast, or one of also [2.326, 2.597] (valid, not decoded for cost in gate mode" in (project.path / "review.html").read_text()


@pytest.mark.slow  # in-process pytester gate run(s): 0.22 s CPU, over the inner loop's 50 s budget (issue 25)
def test_exact_deployment_breaks_a_float_near_tie(project: Project) -> None:
    """c1 and c2 have the same prompts' APFs in another order: equal exactly, but their float
    means differ in the last bit (2.5799999999999996 and 2.58). The exact rule deploys c1 (ties
    go to the first listed), scheduled with bounds and in full alike."""
    tokens, forwards, order = [16, 19, 8, 18, 23], [4, 5, 10, 9, 10], [1, 0, 4, 2, 3]
    rows = {"c0": (forwards, forwards), "c1": (tokens, forwards),
            "c2": ([tokens[k] for k in order], [forwards[k] for k in order])}
    table = OutcomeTable.from_records(
        {"config": c, "prompt": f"p{j}", "correct": 1, "tokens": t[j], "forwards": f[j]} for c, (t, f) in rows.items() for j in range(5))
    assert table.cost("apf")[1] < table.cost("apf")[2]  # the float means
    table.write_csv(project.path / "table.csv")
    live_grid(project, 3, "apf", True, "tie.yaml")
    for extra in ((), ("--redline-full",)):
        assert project.run("--redline-grid=tie.yaml", "--redline-alpha=0.5", "--redline-no-cache", *extra,
                           "--redline-report=tie.json").ret == 0
        assert project.report("tie.json")["deployed"] == "c1"


@pytest.mark.slow  # an in-process pytester gate that writes the review page and the summary
def test_settled_contenders_show_as_intervals_on_every_output(project: Project) -> None:
    """A contender the cost intervals dropped reports its cost and gain as labelled intervals, and
    its accuracy on the prompts it ran: in the JSON report, the review page's table, facts and
    plot, and the Markdown summary."""
    bounds = "bounds: {tokens: [10, 10], forwards: [1, 10], tokens_per_forward: [1, 10]}"
    project.grid(configs=f"{{ref: {{forwards: 10, wrong: [q1, q2, q40], {bounds}}}, fast: {{forwards: 5, wrong: [q3], {bounds}}}, "
                         f"slow: {{forwards: 8, wrong: [q5, q6], {bounds}}}}}", deploy="fastest")
    result = project.run(ALPHA, "--redline-report=report.json", "--redline-html=review.html", "--redline-markdown=summary.md")
    assert result.ret == 0
    report = project.report()
    assert report["deployed"] == "fast"
    slow = by_name(report)["slow"]
    assert slow["cost"] is None and slow["cost_decided"] == "beaten for certain by fast"
    assert slow["cost_interval"] == [pytest.approx(600 / 486), pytest.approx(600 / 459)]  # 3 prompts left: 10 tokens in 1 to 10 forwards
    assert slow["accuracy_on_prompts_run"] == pytest.approx(55 / 57) and slow["prompts_run"] == 57
    page = (project.path / "review.html").read_text()
    assert "[1.235, 1.307] interval" in page and "[+23.5%, +30.7%] interval" in page and "– (55 of the 57 prompts it ran right)" in page
    assert "slow [1.235, 1.307] (beaten for certain by fast)" in page  # the verdict box's cost-intervals fact
    assert 'class="interval"' in page and "slow: gain in [23.5%, 30.7%] (an interval" in page
    summary = (project.path / "summary.md").read_text()
    assert "| [+23.5%, +30.7%] (interval) |" in summary
    assert ("- slow: all-prompt tpf in [1.235, 1.307], gain in [+23.5%, +30.7%] (beaten for certain by fast); "
            "accuracy 0.9649 on the 57 prompts it ran") in summary


@pytest.mark.slow  # an in-process pytester gate that writes the review page and the summary
def test_unbounded_interval_reads_as_unbounded_gain(project: Project) -> None:
    """Gate mode on memory with an engine that declares no bounds: the other valid config is not
    decoded for cost, so its cost interval is (-inf, inf) and its gain a factor in [0, inf), not
    the -0.00x that the gains of infinite costs gave."""
    project.grid(MEMORY.replace(", bounds: {memory_gb: constant}", "").replace("deploy: fastest", "deploy: half"))
    result = project.run(ALPHA, "--redline-report=report.json", "--redline-html=review.html", "--redline-markdown=summary.md")
    assert result.ret == 0
    third = by_name(project.report())["third"]
    assert third["cost_interval"] == [None, None] and third["gain_interval"] == [0.0, None]
    page, summary = (project.path / "review.html").read_text(), (project.path / "summary.md").read_text()
    assert "[0.00x, inf] interval" in page and "third: gain in [0x, inf]" in page
    assert "| [0.00x, ∞] (interval) |" in summary and "-0.00x" not in page + summary
