"""End-to-end: the gate through pytest itself (pytester), with the fake engine and suite.

The fake grid (redline_fakes.GRID): n = 60 prompts, reference `ref` (10 forwards per
prompt, always right), `fast` (5 forwards, wrong on q3: V = 1, valid at alpha = 0.1),
`rash` (2 forwards, wrong on every 4th prompt: V = 15, not valid at alpha = 0.1).
"""
from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from redline_fakes import Project
from terminal_text import flat

pytest_plugins = ["pytester"]

ALPHA = "--redline-alpha=0.1"


@pytest.fixture
def project(pytester: pytest.Pytester) -> Project:
    return Project(pytester)


@pytest.mark.slow  # a subprocess pytest
def test_inert_plugin_without_alpha(project: Project) -> None:
    project.grid()
    project.pytester.makepyfile(test_unit="def test_one():\n    assert True\n")
    script = (
        "import sys, pytest\n"
        "code = pytest.main(['-q', '-p', 'no:cacheprovider'])\n"
        "heavy = [m for m in ('yaml', 'pytest_redline.session', 'pytest_redline.decode.store') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
        "sys.exit(code)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], cwd=project.path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout
    assert "HEAVY []" in run.stdout
    assert not (project.path / ".redline").exists()
    assert project.calls() == []


def test_selection_collects_only_grids_not_testpaths(project: Project) -> None:
    project.grid()
    project.pytester.makeini("[pytest]\ntestpaths = tests\n")
    project.pytester.mkdir("tests")
    (project.path / "tests" / "test_unit.py").write_text("def test_unit():\n    pass\n")
    result = project.run(ALPHA, "--collect-only", "-q")
    ids = [line for line in result.outlines if "::" in line]
    assert len(ids) == 180
    assert ids[0] == "redline.yaml::ref::q0"  # the reference first
    assert "redline.yaml::fast::q17" in ids
    assert not any("test_unit" in line for line in ids)


@pytest.mark.slow  # in-process pytester gate run(s): 0.21 s CPU, over the inner loop's 50 s budget (issue 25)
def test_select_mode_deploys_fastest_valid_config(project: Project) -> None:
    project.grid()
    result = project.run(ALPHA, "--redline-full", "--redline-report=report.json")
    assert result.ret == 0
    assert result.parseoutcomes() == {"passed": 164, "regressed": 16}
    result.stdout.fnmatch_lines([
        "*redline: fake-grid (redline.yaml)*",
        "*alpha=0.1 delta=0.1 holm, n=60 prompts, m=3 configs, cost tpf (higher is better); mode select*",
        "*config*accuracy*V*risk*risk_up*p_value*p_adj",  # the table in two blocks within 120 columns
        "R*ref*1.0000*0*", " [*]  fast*0.9833*1*", "*rash*0.7500*15*",
        "*config*valid*status*cost*gain*d_acc",
        "R*ref*valid*", " [*]  fast*valid*2*+100.0%*-1.7", "*rash*NOT valid*5*+400.0%*-25.0",
        "notes:", "  rash: no n would certify it*",
        "*outcomes: 0 reused from the store, 180 decoded*",
        "*CERTIFIED (fake-grid, select): deploy fast (+100.0% tpf, -1.7 accuracy points)*",
        "*REDLINE CERTIFIED: 1 grid*",
    ])
    report = project.report()
    for key in ("grid", "alpha", "delta", "correction", "n", "m", "reference", "cost", "deploy_mode", "deployed",
                "certified", "alpha_min", "configs"):
        assert key in report
    assert (report["grid"], report["deploy_mode"], report["deployed"], report["certified"]) == ("fake-grid", "select", "fast", True)
    assert (report["n"], report["m"], report["reference"], report["delta"], report["delta_share"]) == (60, 3, "ref", 0.1, 0.1)
    entries = {c["name"]: c for c in report["configs"]}
    assert list(entries) == ["ref", "fast", "rash"]
    for entry in entries.values():
        assert set(entry) >= {"name", "params", "accuracy", "violations", "risk", "risk_upper", "p_value", "p_adjusted",
                              "valid", "cost", "gain", "net_accuracy_points"}
    assert entries["fast"]["params"] == {"forwards": 5, "wrong": ["q3"]}
    assert (entries["fast"]["violations"], entries["fast"]["valid"], entries["fast"]["gain"]) == (1, True, 100.0)
    assert (entries["rash"]["violations"], entries["rash"]["valid"], entries["rash"]["prompts_needed"]) == (15, False, None)


GATE_CONFIGS = "{ref: {forwards: 10}, slow: {forwards: 8}, fast: {forwards: 5, wrong: [q3]}, rash: {forwards: 2, wrong_every: 4}}"


@pytest.mark.slow  # in-process pytester gate run(s): 0.25 s CPU, over the inner loop's 50 s budget (issue 25)
def test_gate_mode_leads_with_named_config(project: Project) -> None:
    """deploy: slow, while fast is the best-cost valid config: the verdict, the mark and the
    JSON name slow (certified, deployed); fast is only a hint (best_valid)."""
    project.grid(deploy="slow", configs=GATE_CONFIGS)
    result = project.run(ALPHA, "--redline-report=report.json")
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "R    ref*", " [*]G  slow*valid*+25.0%*", "     fast*valid*+100.0%*",
        "*G gated (deploy: NAME)*",
        "hint: the best-cost valid config is fast (+100.0% tpf, -1.7 accuracy points) (what deploy: fastest would serve)",
        "CERTIFIED (fake-grid, gate): slow is certified; deploy slow (+25.0% tpf, +0.0 accuracy points)",
    ])
    report = project.report()
    assert list(report)[:2] == ["requested", "certified"]
    assert (report["requested"], report["certified"], report["deployed"], report["best_valid"]) == ("slow", True, "slow", "fast")
    assert (report["deploy_mode"], report["required"]) == ("gate", ["slow"])


@pytest.mark.slow  # in-process pytester gate run(s): 0.22 s CPU, over the inner loop's 50 s budget (issue 25)
def test_gate_mode_deploys_reference_when_named_config_not_valid(project: Project) -> None:
    project.grid(configs=GATE_CONFIGS)
    result = project.run(ALPHA, "--redline-deploy", "rash", "--redline-report=report.json")
    assert result.ret == 1
    result.stdout.fnmatch_lines([
        "R[*]   ref*", "     fast*valid*", "  G  rash*NOT valid*",
        "NOT CERTIFIED (fake-grid, gate): rash is NOT valid at alpha=0.1; deploy ref (the reference)",
        "*REDLINE NOT CERTIFIED: fake-grid (exit status 1)*",
    ])
    report = project.report()
    assert (report["requested"], report["certified"], report["deployed"], report["best_valid"]) == ("rash", False, "ref", "fast")
    assert report["not_certified"] == ["rash"]


@pytest.mark.slow  # in-process pytester gate run(s): 0.90 s CPU, over the inner loop's 50 s budget (issue 25)
def test_all_mode_requires_every_candidate(project: Project) -> None:
    project.grid(deploy="DROP")
    result = project.run(ALPHA)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*NOT CERTIFIED (fake-grid, all): 1 of 2 required configs not valid*: rash*"])
    project.grid(deploy="DROP", configs="{ref: {forwards: 10}, fast: {forwards: 5, wrong: [q3]}}")
    assert project.run(ALPHA).ret == 0


def test_needed_prompts_reported_for_uncertified_config(project: Project) -> None:
    project.grid(configs="{ref: {}, near: {forwards: 5, wrong: [q1, q2, q3, q4]}}", deploy="near")
    result = project.run(ALPHA, "--redline-full", "--redline-report=report.json")
    assert result.ret == 1
    near = project.report()["configs"][1]
    assert near["valid"] is False and near["violations"] == 4
    from pytest_redline.planning import prompts_needed

    expected = prompts_needed(0.1, 4 / 60, 2, 0.1, power=0.8)
    assert near["prompts_needed"] == expected
    result.stdout.fnmatch_lines(["*near*NOT valid*", f"  near: n={expected} prompts would certify it with 80% power*"])


@pytest.mark.slow  # in-process pytester gate run(s): 0.19 s CPU, over the inner loop's 50 s budget (issue 25)
def test_regressions_do_not_fail_certified_session(project: Project) -> None:
    project.grid(configs="{ref: {forwards: 10}, fast: {forwards: 5, wrong: [q3]}}")
    result = project.run(ALPHA, "-v", "--redline-report=report.json", "--junitxml=junit.xml")
    assert result.ret == 0
    assert result.parseoutcomes() == {"passed": 119, "regressed": 1}
    result.stdout.fnmatch_lines([
        "*redline.yaml::fast::q3 REGRESSED*",
        "*regressions: 1 (fast: 1)*",
        "*REGRESSED fast::q3*",
        "*reference answer: '4'*",
        "*candidate answer: 'wrong'*",
    ])
    assert project.report()["regressions"] == [
        {"config": "fast", "prompt": "q3", "reference_answer": "4", "candidate_answer": "wrong",
         "reference_extracted": None, "reference_rule": "score", "candidate_extracted": None, "candidate_rule": "score"}
    ]
    case = ET.parse(project.path / "junit.xml").find(".//testcase[@name='q3'][@classname='redline.yaml.fast']")
    properties = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert properties["regression"] == "True"
    assert (properties["correct"], properties["tokens"], properties["forwards"]) == ("False", "10.0", "5.0")


def test_engine_error_blocks_certification(project: Project) -> None:
    project.grid(configs="{ref: {forwards: 10}, fast: {forwards: 5, fail_on: q5}}")
    result = project.run(ALPHA, "--redline-full", "--redline-report=report.json")
    assert result.ret == 1
    assert result.parseoutcomes() == {"passed": 112, "errors": 8}  # the batch q0..q7
    # In full once, then pointers (the short summary, untruncated when CI is set, is left out).
    errors_section = result.stdout.str().split("short test summary info")[0]
    assert errors_section.count("RuntimeError: fake engine exploded on q5") == 1
    result.stdout.fnmatch_lines([
        "*engine 'fake' failed on batch 1 of config 'fast' (prompts q0 .. q7): RuntimeError: fake engine exploded on q5*",
        "*engine 'fake' failed on batch 1 of config 'fast' (prompts q0 .. q7) (the full error is reported at redline.yaml::fast::q0)",
        "*PARTIAL RUN: 8 of 120 items produced no outcome*",
        "*errored: 8 (fast::q0, fast::q1, fast::q2, ... (5 more))*",
        "*REDLINE NOT CERTIFIED*",
    ])
    report = project.report()
    assert (report["certified"], report["complete"], len(report["missing"])) == (False, False, 8)


@pytest.mark.slow  # in-process pytester gate run(s): 0.20 s CPU, over the inner loop's 50 s budget (issue 25)
def test_scorer_crash_is_an_error(project: Project) -> None:
    project.grid(suite_args="{n: 60, crash_on: q7}")
    result = project.run(ALPHA)
    assert result.ret == 1
    assert result.parseoutcomes()["errors"] == 3
    result.stdout.fnmatch_lines(["*scoring prompt 'q7' of config 'ref' failed: RuntimeError: fake scorer crashed on q7*"])


def test_timeout_is_an_error(project: Project) -> None:
    project.grid(engine_args="{delay: 2.0}", timeout="0.2", configs="{ref: {}, fast: {forwards: 5}}", suite_args="{n: 40}",
                 batch_size="40")
    result = project.run(ALPHA)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*BatchTimeout: timed out after 0.2 s (grid key timeout)*"])


def test_deselection_refuses_certificate(project: Project) -> None:
    project.grid()
    result = project.run(ALPHA, "-k", "fast and q1", "--redline-report=report.json")  # q1, q10 .. q19
    assert result.ret == 1
    result.stdout.fnmatch_lines([
        "*PARTIAL RUN: 169 of 180 items produced no outcome, so nothing is certified*",
        "*deselected: 169 (ref::q0, ref::q1, ref::q2, ... (166 more))*",
        "*NOT CERTIFIED (fake-grid): partial run, 169 items missing*",
    ])
    assert project.report()["certified"] is False
    decoded = sorted((c["config"]["forwards"], c["prompts"][0]) for c in project.calls())
    assert decoded == [(5, "q0"), (5, "q16"), (5, "q8"), (10, "q0"), (10, "q16"), (10, "q8")]  # only the batches needed


@pytest.mark.slow  # in-process pytester gate run(s): 0.24 s CPU, over the inner loop's 50 s budget (issue 25)
def test_two_grids_split_delta(project: Project) -> None:
    project.grid(filename="one.yaml")
    project.grid(filename="two.yaml", name="second")
    result = project.run(ALPHA, "--redline-grid", "one.yaml", "--redline-grid", "two.yaml", "--redline-report=report.json")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*delta=0.1 (share 0.05: split over 2 grids, Bonferroni)*"])
    report = project.report()
    assert [g["grid"] for g in report["grids"]] == ["fake-grid", "second"]
    assert all(g["delta"] == 0.1 and g["delta_share"] == 0.05 and g["grids_in_session"] == 2 for g in report["grids"])


@pytest.mark.slow  # in-process pytester gate run(s): 0.31 s CPU, over the inner loop's 50 s budget (issue 25)
def test_rerun_reuses_store_with_identical_verdict(project: Project) -> None:
    project.grid()
    first = project.run(ALPHA, "--redline-report=first.json")
    calls = len(project.calls())
    second = project.run(ALPHA, "--redline-report=second.json")
    assert first.ret == second.ret == 0
    assert len(project.calls()) == calls
    one, two = project.report("first.json"), project.report("second.json")
    run = one["spend"]["items_run"]
    second.stdout.fnmatch_lines([f"*outcomes: {run} reused from the store, 0 decoded*"])
    assert one.pop("outcomes") == {"reused": 0, "decoded": run}
    assert two.pop("outcomes") == {"reused": run, "decoded": 0}
    spent, again = one.pop("spend"), two.pop("spend")
    assert (again["forwards"], again["decoded_forwards"]) == (spent["forwards"], 0)
    assert [c.pop("decode_seconds") for c in two["configs"]] == [0.0, 0.0, 0.0]  # nothing decoded
    for c in one["configs"]:
        del c["decode_seconds"]  # wall time
    assert one == two


@pytest.mark.slow  # in-process pytester gate run(s): 0.32 s CPU, over the inner loop's 50 s budget (issue 25)
def test_store_key_separates_devices(project: Project) -> None:
    project.grid()
    project.run(ALPHA, "--redline-full")
    project.grid(engine_args="{log_path: calls.jsonl, device: cuda}")
    result = project.run(ALPHA, "--redline-full")
    result.stdout.fnmatch_lines(["*outcomes: 0 reused from the store, 180 decoded*"])


@pytest.mark.slow  # in-process pytester gate run(s): 1.13 s CPU, over the inner loop's 50 s budget (issue 25)
def test_no_cache_neither_reuses_nor_keeps(project: Project) -> None:
    project.grid()
    project.run(ALPHA, "--redline-full")
    result = project.run(ALPHA, "--redline-full", "--redline-no-cache")
    result.stdout.fnmatch_lines(["*outcomes: 0 reused from the store, 180 decoded*"])
    result = project.run(ALPHA, "--redline-full", "--redline-cache-dir", "elsewhere")
    result.stdout.fnmatch_lines(["*outcomes: 0 reused from the store, 180 decoded*"])
    assert (project.path / "elsewhere" / "outcomes.sqlite").exists()


@pytest.mark.slow  # in-process pytester gate run(s): 0.18 s CPU, over the inner loop's 50 s budget (issue 25)
def test_progress_lines_show_under_quiet(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pytest_redline.decode.progress.PROGRESS_EVERY_S", 0.0)
    project.grid()
    result = project.run(ALPHA, "-q")
    result.stdout.fnmatch_lines([
        "redline fake-grid ref: 8/60 prompts, batch 1/8 (1 decoded), * s",
        "redline fake-grid ref: 60/60 prompts, batch 8/8 (8 decoded), * s",
        "redline fake-grid rash: 8/60 reference-correct prompts, batch 1/8 (1 decoded), * s, stopped: cannot be certified",
    ])


@pytest.mark.slow  # in-process pytester gate run(s): 0.33 s CPU, over the inner loop's 50 s budget (issue 25)
def test_roundtrip_outcome_csv_through_replay(project: Project) -> None:
    project.grid()
    first = project.run(ALPHA, "--redline-full", "--redline-outcomes=out.csv", "--redline-report=live.json")
    assert first.ret == 0
    project.grid(
        "name: replayed\nengine: replay\nengine_args: {outcomes: out.csv}\ncost: tpf\nreference: ref\ndeploy: fastest\n",
        filename="replay.yaml",
    )
    second = project.run(ALPHA, "--redline-full", "--redline-grid=replay.yaml", "--redline-report=replay.json")
    assert second.ret == 0
    live, replayed = project.report("live.json"), project.report("replay.json")
    strip = ("params", "decode_seconds")  # decode_seconds: wall time
    assert [{k: v for k, v in c.items() if k not in strip} for c in live["configs"]] == [
        {k: v for k, v in c.items() if k not in strip} for c in replayed["configs"]
    ]
    assert replayed["deployed"] == live["deployed"] == "fast"


def test_stop_after_first_error_is_partial(project: Project) -> None:
    project.grid(configs="{ref: {forwards: 10}, fast: {forwards: 5, fail_on: q5}}")
    result = project.run(ALPHA, "--redline-full", "-x")
    assert result.ret == 1
    result.stdout.fnmatch_lines([
        "*PARTIAL RUN: 60 of 120 items produced no outcome*",
        "*errored: 1 (fast::q0)*",
        "*not run: 59 (fast::q1, fast::q2, fast::q3, ... (56 more))*",
    ])


@pytest.mark.slow  # a subprocess gate, interrupted
def test_interrupt_summary_states_real_exit_status(project: Project) -> None:
    """Ctrl-C mid-decode: the process returns 2 (interrupted), and the summary says 2, not 1."""
    import signal
    import subprocess
    import time

    project.grid(engine_args="{log_path: calls.jsonl, delay: 0.3}")
    from interruptible import interruptible

    run = subprocess.Popen(interruptible(project.command(ALPHA)), cwd=project.path, env=project.env(),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not project.calls() and time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.05)
    run.send_signal(signal.SIGINT)
    out, _ = run.communicate(timeout=120)
    assert run.returncode == pytest.ExitCode.INTERRUPTED
    assert "REDLINE NOT CERTIFIED: fake-grid (interrupted, exit status 2)" in out, out[-2000:]


@pytest.mark.parametrize("option", ["--redline-grid", "--redline-cache-dir"])
@pytest.mark.slow  # in-process pytester gate run(s): 0.40 s CPU, over the inner loop's 50 s budget (issue 25)
def test_usage_error_spaced_path_option_moves_rootdir(project: Project, option: str) -> None:
    """`--redline-grid /outside/grid.yaml` (a space, not '='): pytest took the value for a test
    path before the plugin's options were known, so the rootdir moved; say so, and how to write it."""
    project.grid()
    (project.path / "pytest.ini").write_text("[pytest]\n")
    outside = project.path.parent / f"outside-{project.path.name}"  # beside the project, no ini above it
    outside.mkdir()
    value = outside / "grid.yaml" if option == "--redline-grid" else outside
    if option == "--redline-grid":
        value.write_text((project.path / "redline.yaml").read_text())
    result = project.run(ALPHA, option, str(value))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {option} {value}: pytest fixes the rootdir before plugin options are known, "
                                 f"so it also took {value} as a test path and the rootdir moved to *; without it "
                                 f"the rootdir is {project.path}. Write {option}={value} (with '=')"])
    assert project.calls() == []
    assert project.run(ALPHA, f"{option}={value}").ret == 0


@pytest.mark.slow  # in-process pytester gate run(s): 0.18 s CPU, over the inner loop's 50 s budget (issue 25)
def test_wall_time_cost_ranking_said_estimate(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cost the engine measures as wall time (its wall_time_costs): the summary and the JSON
    say the ranking is an estimate; the certificate is unchanged."""
    import redline_fakes
    from tests.risk.test_schedule import random_table

    monkeypatch.setattr(redline_fakes.TableEngine, "wall_time_costs", ("latency_s",), raising=False)
    random_table(0, 3, 60).with_column("latency_s", [2.0, 1.5, 1.0]).write_csv(project.path / "table.csv")
    project.grid("name: timed\nsuite: table\nsuite_args: {outcomes: table.csv}\nengine: table\n"
                 "engine_args: {outcomes: table.csv}\ncost: latency_s\ndirection: lower\nreference: c0\n"
                 "configs: {c0: {config: c0}, c1: {config: c1}, c2: {config: c2}}\ndeploy: fastest\n")
    result = project.run("--redline-alpha=0.3", "--redline-report=report.json")
    assert ("note: the cost latency_s is a measured wall time, so the cost ranking (and the deployed config) is an "
            "estimate; the certificate, which concerns correctness only, is exact") in flat(result)
    assert project.report()["schedule"]["cost_estimated"] is True
