"""End-to-end: the schedule through pytest itself (pytester), with the fake engine and suite.

The fake grid (redline_fakes.GRID): n = 60, batches of 8, reference `ref` (always right),
`fast` (wrong on q3: valid at alpha = 0.1), `rash` (wrong on every 4th prompt: stops
early, it cannot be certified).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from redline_fakes import Project
from terminal_text import flat
from tests.risk.test_schedule import random_table

pytest_plugins = ["pytester"]

ALPHA = "--redline-alpha=0.1"
WRONG_REFERENCE = "{ref: {forwards: 10, wrong: [q1, q2]}, fast: {forwards: 5, wrong: [q3]}, rash: {forwards: 2, wrong_every: 4}}"


@pytest.fixture
def project(pytester: pytest.Pytester) -> Project:
    return Project(pytester)


def by_name(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["configs"]}


@pytest.mark.slow  # in-process pytester gate run(s): 0.21 s CPU, over the inner loop's 50 s budget (issue 25)
def test_skipped_items_show_why(project: Project) -> None:
    project.grid(configs=WRONG_REFERENCE)
    result = project.run(ALPHA, "-rs", "--redline-report=report.json", "--redline-markdown=summary.md")
    assert result.ret == 0
    report = project.report()
    configs = by_name(report)
    early, regressed = report["schedule"]["skipped"]["early_stop"], len(report["regressions"])
    assert result.parseoutcomes() == {"passed": 180 - 2 - early - regressed, "regressed": regressed, "skipped": 2 + early}
    result.stdout.fnmatch_lines([
        "R   ref*60*0.9667*1.0000*", " [*]  fast*60*0.9833*0.9828*1*", "    rash*8*-*0.6250*>=3*",
        "R   ref*valid*", " [*]  fast*valid*2*+100.0%*+1.7", "    rash*NOT valid*-*-*-",
        "  rash: stopped early: cannot be certified; acc_rc and its risk estimate are biased*",
    ])
    text = flat(result)
    assert "-: not decoded on every prompt (stopped early or skipped where the reference is wrong), so not comparable" in text
    assert (f"schedule: reference first, candidates in a seeded order (seed 0), batches where earlier candidates regressed "
            f"first; skipped 2 items where the reference is wrong and {early} after early stops (1 cannot be certified, "
            "0 certain to pass)") in text
    assert "spend: 916 forwards on 128 of 180 items vs 1,020 for the full grid: 0.90x (the rest estimated at each config's mean)" in text
    result.stdout.fnmatch_lines([
        "CERTIFIED (fake-grid, select): deploy fast (+100.0% tpf, +1.7 accuracy points)",
        f"SKIPPED [[]{early}[]] *: redline: early stop, verdict already decided (cannot be certified)",
        "SKIPPED [[]2[]] *: redline: reference wrong on this prompt",
    ])
    assert report["schedule"] == {"mode": "scheduled", "seed": 0, "skipped": {"reference_wrong": 2, "early_stop": early},
                                  "cost_estimated": False}
    # fast is valid: decoded on the two prompts the reference gets wrong too, so its figures are on all 60
    assert (configs["ref"]["prompts_run"], configs["fast"]["prompts_run"], configs["rash"]["prompts_run"]) == (60, 60, 8)
    assert "q1" in configs["fast"]["ran_on"] and "q1" not in configs["rash"]["ran_on"]
    assert (configs["rash"]["stopped"], configs["rash"]["violations_bound"]) == ("cannot be certified", "lower")
    assert (configs["fast"]["stopped"], configs["fast"]["violations_bound"], configs["fast"]["valid"]) == (None, "exact", True)
    assert configs["fast"]["net_accuracy_points"] == pytest.approx(100 / 60)  # all-prompt: 59 of 60 against 58 of 60
    assert configs["fast"]["accuracy_on_reference_correct"] == pytest.approx(57 / 58)
    # the adaptive order: rash (after fast) visits first the batch holding q3, where fast regressed, so its
    # 8 prompts are not a prefix of the seeded order and its rate, acc_rc and prompts needed are labelled biased
    assert "q3" in configs["rash"]["ran_on"]
    assert (configs["rash"]["estimates_biased"], configs["fast"]["estimates_biased"]) == (True, False)
    assert configs["rash"]["status"] == "inconclusive"  # what would settle it rests on the biased rate, and says so
    assert re.search(r"- rash \(❔ inconclusive\): .* at risk \S+ \(a biased estimate: the adaptive order ran it first",
                     (project.path / "summary.md").read_text())
    rash = configs["rash"]
    assert (rash["accuracy"], rash["net_accuracy_points"], rash["cost"], rash["gain"]) == (None, None, None, None)
    assert (rash["accuracy_on_reference_correct"], rash["cost_on_prompts_run"]) == (pytest.approx(5 / 8), 5.0)
    assert report["spend"]["exact"] is False and report["spend"]["items_run"] == 128


@pytest.mark.slow  # an in-process gate decoding all 180 items: 0.6 s (1.3 s as the process's first gate) here, 6.6 s under load
def test_full_option_decodes_everything(project: Project) -> None:
    project.grid(configs=WRONG_REFERENCE)
    result = project.run(ALPHA, "--redline-full", "--redline-report=report.json")
    assert result.ret == 0
    assert result.parseoutcomes() == {"passed": 164, "regressed": 16}
    result.stdout.fnmatch_lines(["*schedule: full (--redline-full)", "*spend: 1,020 forwards on 180 of 180 items vs 1,020 *: 1.00x (exact*"])
    report = project.report()
    assert report["schedule"]["mode"] == "full (--redline-full)"
    assert all(c["prompts_run"] == 60 and c["stopped"] is None for c in report["configs"])


@pytest.mark.slow  # in-process pytester gate run(s): 1.12 s CPU, over the inner loop's 50 s budget (issue 25)
def test_equivalent_verdict_any_seed(project: Project) -> None:
    project.grid()
    project.run(ALPHA, "--redline-report=zero.json")
    zero = {(c["config"]["forwards"], tuple(c["prompts"])) for c in project.calls()}
    project.run(ALPHA, "--redline-seed=5", "--redline-report=five.json")
    five = {(c["config"]["forwards"], tuple(c["prompts"])) for c in project.calls()} - zero
    assert all(forwards != 10 for forwards, _ in five)  # the reference's batches are reused; candidates' reordered
    one, two = project.report("zero.json"), project.report("five.json")
    assert [c["valid"] for c in one["configs"]] == [c["valid"] for c in two["configs"]]
    assert (one["deployed"], two["schedule"]["seed"]) == (two["deployed"], 5)


@pytest.mark.slow  # in-process pytester gate run(s): 0.45 s CPU, over the inner loop's 50 s budget (issue 25)
def test_incremental_rerun_decodes_only_changed_config(project: Project) -> None:
    project.grid()
    project.run(ALPHA)
    before = len(project.calls())
    unchanged = project.run(ALPHA, "--redline-report=unchanged.json")
    assert len(project.calls()) == before  # nothing changed: nothing decoded
    assert unchanged.ret == 0 and project.report("unchanged.json")["outcomes"]["decoded"] == 0
    project.grid(configs="{ref: {forwards: 10}, fast: {forwards: 6, wrong: [q3]}, rash: {forwards: 2, wrong_every: 4}}")
    changed = project.run(ALPHA, "--redline-report=changed.json")
    assert changed.ret == 0
    assert {call["config"]["forwards"] for call in project.calls()[before:]} == {6}  # only `fast`
    report = project.report("changed.json")
    assert report["outcomes"]["decoded"] == by_name(report)["fast"]["prompts_run"] == 60


@pytest.mark.slow  # in-process pytester gate run(s): 0.43 s CPU, over the inner loop's 50 s budget (issue 25)
def test_outcome_export_needs_full_run(project: Project) -> None:
    project.grid()
    refused = project.run(ALPHA, "--redline-outcomes=out.csv")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["*--redline-outcomes writes complete outcome tables, but the schedule skips items *"
                                  "(redline.yaml): add --redline-full*"])
    assert project.calls() == []
    assert project.run(ALPHA, "--redline-full", "--redline-outcomes=out.csv").ret == 0
    project.grid("name: replayed\nengine: replay\nengine_args: {outcomes: out.csv}\ncost: tpf\nreference: ref\n"
                 "deploy: fastest\n", filename="replay.yaml")
    replayed = project.run(ALPHA, "--redline-grid=replay.yaml", "--redline-outcomes=again.csv")  # replayed: allowed
    assert replayed.ret == 0
    assert (project.path / "again.csv").read_text() == (project.path / "out.csv").read_text()


@pytest.mark.slow  # in-process pytester gate run(s): 0.19 s CPU, over the inner loop's 50 s budget (issue 25)
def test_fallback_to_full_run_when_selection_partial(project: Project) -> None:
    project.grid()
    result = project.run(ALPHA, "-k", "not q1", "--redline-report=report.json")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*PARTIAL RUN: 33 of 180 items produced no outcome*",
                                 "*schedule: full: scheduling could not hold (33 of 180 items not selected)"])
    assert "skipped" not in result.parseoutcomes()


@pytest.mark.slow  # in-process pytester gate run(s): 0.18 s CPU, over the inner loop's 50 s budget (issue 25)
def test_fallback_to_full_run_when_reference_errors(project: Project) -> None:
    project.grid(configs="{ref: {forwards: 10, fail_on: q5}, fast: {forwards: 5, wrong: [q3]}}")
    result = project.run(ALPHA)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*schedule: full: scheduling could not hold (the reference has no outcome on 8 prompts)"])
    assert sorted(len(c["prompts"]) for c in project.calls() if c["config"]["forwards"] == 5) == [4] + [8] * 7


# --------------------------------------------------------------------------- usage errors and failures


@pytest.mark.parametrize(("replace", "key"), [
    ({"engine_args": "{log_path: calls.jsonl, model: models/missing}"}, "engine_args.model"),
    ({"suite_args": "{n: 60, path: data/missing.jsonl}"}, "suite_args.path"),
    ({"configs": "{ref: {}, fast: {engine_args: {draft: drafts/small}}}"}, "configs.fast.engine_args.draft"),
])
@pytest.mark.slow  # in-process pytester gate run(s): 0.19 s CPU, over the inner loop's 50 s budget (issue 25)
def test_usage_error_missing_input_path(project: Project, replace: dict, key: str) -> None:
    project.grid(**replace)
    result = project.run(ALPHA)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    resolved = Path(project.path, *list(replace.values())[0].split(": ")[-1].rstrip("}").split(", ")[0].split("/"))
    result.stderr.fnmatch_lines([f"*redline.yaml: {key}: expected an existing file or folder, got {resolved} "
                                 "(no such file or folder; relative paths resolve against the grid file's folder)"])
    assert project.calls() == [] and not (project.path / ".redline").exists()


@pytest.mark.slow  # in-process pytester gate run(s): 0.23 s CPU, over the inner loop's 50 s budget (issue 25)
def test_engine_build_failure_reported_once(project: Project) -> None:
    project.grid(engine_args="{log_path: calls.jsonl, colour: red}")
    result = project.run(ALPHA)
    assert result.ret == 1
    assert result.parseoutcomes() == {"errors": 180}
    text = result.stdout.str().split("short test summary info")[0]  # its lines are untruncated under CI
    assert text.count("TypeError") == 1  # the one full error; every other item points to it
    assert text.count("config 'ref': its engine failed to build (the full error is reported at redline.yaml::ref::q0)") == 179


@pytest.mark.slow  # in-process pytester gate run(s): 0.35 s CPU, over the inner loop's 50 s budget (issue 25)
def test_prompts_needed_over_limit_said_not_computed(project: Project) -> None:
    wrong = ", ".join(f"q{i}" for i in range(0, 190, 10))  # risk 19/200, just under alpha: ~22,000 prompts needed
    project.grid(suite_args="{n: 200}", configs=f"{{ref: {{}}, near: {{forwards: 5, wrong: [{wrong}]}}}}", deploy="near")
    result = project.run(ALPHA, "--redline-full", "--redline-report=report.json")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*near*NOT valid*", "  near: over 20000 prompts would be needed to certify it at risk 0.0950"])
    near = by_name(project.report())["near"]
    assert (near["prompts_needed"], near["prompts_needed_over"]) == (None, 20000)


# --------------------------------------------------------------------------- the law, through the gate


@pytest.mark.slow  # two gates that decode, over 5 s
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(2, 4), n=st.integers(60, 150), alpha=st.sampled_from([0.1, 0.2]))
@example(seed=0, m=4, n=150, alpha=0.2)
@example(seed=1, m=4, n=60, alpha=0.2)  # costs on the prompts run deploy another config than costs on all
def test_equivalent_deployment_scheduled_and_full_through_gate(project: Project, seed: int, m: int, n: int, alpha: float) -> None:
    """Random outcome tables, gated twice (scheduled, with the adaptive visiting order the
    decoder always uses, and --redline-full) as a replayed grid and as a live one (a
    deterministic engine): the same valid sets and the same deployed config."""
    random_table(seed, m, n).write_csv(project.path / "table.csv")
    names = ", ".join(f"c{i}: {{config: c{i}}}" for i in range(m))
    project.grid("name: replayed\nengine: replay\nengine_args: {outcomes: table.csv}\nreference: c0\ndeploy: fastest\n",
                 filename="replayed.yaml")
    project.grid(f"name: live\nsuite: table\nsuite_args: {{outcomes: table.csv}}\nengine: table\n"
                 f"engine_args: {{outcomes: table.csv}}\nreference: c0\nconfigs: {{{names}}}\ndeploy: fastest\n",
                 filename="live.yaml")
    grids = ["--redline-grid=replayed.yaml", "--redline-grid=live.yaml", "--redline-no-cache", f"--redline-alpha={alpha}"]
    assert project.run(*grids, "--redline-report=scheduled.json").ret == 0
    assert project.run(*grids, "--redline-full", "--redline-report=full.json").ret == 0
    for scheduled, full in zip(project.report("scheduled.json")["grids"], project.report("full.json")["grids"]):
        assert [c["valid"] for c in scheduled["configs"]] == [c["valid"] for c in full["configs"]]
        assert scheduled["deployed"] == full["deployed"]
        assert all(c["stopped"] for c in scheduled["configs"] if c["estimates_biased"])  # only a stopped config's
        deployed = by_name(scheduled)[scheduled["deployed"]]
        assert (deployed["cost"], deployed["net_accuracy_points"]) == pytest.approx(
            (by_name(full)[full["deployed"]]["cost"], by_name(full)[full["deployed"]]["net_accuracy_points"]))


@pytest.mark.slow  # a scheduled and a full gate: 3 s of CPU here
def test_deployment_matches_full_run_published_pair(project: Project) -> None:
    """The issue's case: acc95/semi90 against acc95/semi90/add0.05 from the published
    llada2_math data, served live. On the prompts each ran on, add0.05 looked +6.1 % TPF
    faster; on all 1012 prompts it is -1.0 %, so the reference is deployed, as by --redline-full."""
    from published import DATA

    from pytest_redline.outcomes import OutcomeTable

    table = OutcomeTable.read_csv(DATA / "llada2_math.csv").select(["acc95/semi90", "acc95/semi90/add0.05"])
    table.write_csv(project.path / "pair.csv")
    project.grid("name: pair\nsuite: table\nsuite_args: {outcomes: pair.csv}\nengine: table\n"
                 "engine_args: {outcomes: pair.csv}\nreference: ref\nbatch_size: 16\n"
                 "configs: {ref: {config: acc95/semi90}, add05: {config: acc95/semi90/add0.05}}\ndeploy: fastest\n")
    result = project.run(ALPHA, "--redline-report=report.json")
    assert result.ret == 0
    report = project.report()
    add05 = by_name(report)["add05"]
    assert (report["deployed"], add05["valid"], add05["prompts_run"]) == ("ref", True, 1012)
    assert round(add05["gain"], 1) == -1.0 and round(add05["net_accuracy_points"], 1) == -0.9
    result.stdout.fnmatch_lines(["CERTIFIED (pair, select): deploy ref (the reference)"])
