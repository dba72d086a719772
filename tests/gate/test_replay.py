"""End-to-end: the paper's published LLaDA2 math outcomes gated through pytest by `replay`.

Published (Table 2, the first 7 configs, delta = 0.10): at alpha = 0.10 Redline deploys
acc85/semi70 with +37.5 % TPF and -4.0 accuracy points; alpha_min is 0.07. At alpha = 0.05
acc85/semi70 is not certified (its observed risk 0.072 exceeds alpha). The schedule gives
the same valid sets and deployment for about two thirds of the naive forwards.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from redline_fakes import Project
from terminal_text import flat, too_wide

pytest_plugins = ["pytester"]

DATA = Path(__file__).resolve().parents[1] / "data" / "redline" / "llada2_math.csv"
GRID = f"""\
name: llada2-math-published
engine: replay
engine_args: {{outcomes: {DATA}}}
cost: tpf
reference: acc95/semi90
configs: [acc85/semi70, acc85/semi90, acc90/semi70, acc90/semi90, acc95/semi70, acc95/semi90, acc99/semi90]
deploy: fastest
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> Project:
    return Project(pytester)


@pytest.mark.slow  # the full published grid, over 5 s
def test_replay_reproduces_published_llada2_math(project: Project) -> None:
    project.grid(GRID)
    full = project.run("--redline-alpha=0.1", "--redline-full", "--redline-report=full.json")
    assert full.ret == 0
    assert full.parseoutcomes() == {"passed": 6733, "regressed": 351}
    assert too_wide(full) == []  # every line of the terminal summary within 120 columns
    full.stdout.fnmatch_lines([
        "*CERTIFIED (llada2-math-published, select): deploy acc85/semi70 (+37.5% tpf, -4.0 accuracy points)*",
        "*REDLINE CERTIFIED: 1 grid*",
    ])
    report = project.report("full.json")
    assert (report["n"], report["m"], report["deployed"], report["alpha_min"]) == (1012, 7, "acc85/semi70", 0.07)
    deployed = report["configs"][0]
    assert deployed["name"] == "acc85/semi70"
    assert round(deployed["gain"], 1) == 37.5 and round(deployed["net_accuracy_points"], 1) == -4.0
    # its GSM8K and MATH-500 slices (by the id's prefix, no slice_by: in the grid), whose V add up to the grid's
    full.stdout.fnmatch_lines(["slices by prefix (2: gsm8k, math500): descriptive exact counts, not certificates*",
                               "*config*slice*prompts*decoded*V*correct*accuracy",
                               "*acc85/semi70*gsm8k*512*512*19*465*0.9082", "*acc85/semi70*math500*500*500*54*369*0.7380"])
    (sliced,) = report["slices"]
    assert sliced["by"] == "prefix" and sliced["slices"] == ["gsm8k", "math500"]
    for c in report["configs"]:
        assert sum(row["violations"] for row in sliced["rows"] if row["config"] == c["name"]) == c["violations"]

    scheduled = project.run("--redline-alpha=0.1", "--redline-report=scheduled.json")
    assert scheduled.ret == 0
    one = project.report("scheduled.json")
    assert [c["valid"] for c in one["configs"]] == [c["valid"] for c in report["configs"]]
    assert one["deployed"] == report["deployed"] and one["alpha_min"] == report["alpha_min"]
    for a, b in zip(one["configs"], report["configs"]):  # replayed: cost, gain and d_acc on all prompts
        assert (a["cost"], a["gain"], a["net_accuracy_points"]) == (b["cost"], b["gain"], b["net_accuracy_points"])
    spend = one["spend"]
    assert spend["exact"] and spend["naive_forwards"] == report["spend"]["forwards"]
    assert 0.4 <= spend["ratio"] <= 0.7
    assert one["schedule"]["skipped"]["reference_wrong"] == 6 * 138  # 138 prompts the reference gets wrong
    assert too_wide(scheduled) == []
    scheduled.stdout.fnmatch_lines(["*spend: * forwards on * of 7084 items vs 1,111,267 for the full grid: 0.6*x (exact*"])

    gated = project.run("--redline-alpha=0.05", "--redline-deploy", "acc85/semi70", "--redline-report=gate.json")
    assert gated.ret == 1 and too_wide(gated) == []
    gated.stdout.fnmatch_lines([
        "*acc85/semi70*>=*", "*acc85/semi70*NOT valid*", "notes:",
        "  acc85/semi70: stopped early: cannot be certified; no n would certify it: risk on all prompts 0.0721 >= alpha*",
        "*REDLINE NOT CERTIFIED: llada2-math-published (exit status 1)*",
    ])
    assert ("NOT CERTIFIED (llada2-math-published, gate): acc85/semi70 is NOT valid at alpha=0.05; deploy acc95/semi90 "
            "(the reference)") in flat(gated)
    assert project.report("gate.json")["certified"] is False


def test_replay_mapping_entry_without_params_replays_its_name(project: Project) -> None:
    """configs as a mapping with empty parameters (`acc85/semi70: {}`) replays the recorded
    config of that name, as a list entry does."""
    lines = DATA.read_text().splitlines()
    prompts = {row.split(",")[1] for row in lines[1:]}
    keep = set(sorted(prompts)[:100])
    (project.path / "small.csv").write_text("\n".join([lines[0]] + [r for r in lines[1:] if r.split(",")[1] in keep]) + "\n")
    project.grid(GRID.replace(str(DATA), "small.csv").replace(
        "configs: [acc85/semi70, acc85/semi90, acc90/semi70, acc90/semi90, acc95/semi70, acc95/semi90, acc99/semi90]",
        "configs: {acc95/semi90: {}, acc85/semi70: {}}"))
    result = project.run("--redline-alpha=0.2", "--redline-full", "--redline-report=report.json")
    assert result.ret == 0 and result.parseoutcomes().get("errors") is None
    report = project.report()
    assert [(c["name"], c["params"]) for c in report["configs"]] == [
        ("acc95/semi90", {"config": "acc95/semi90"}), ("acc85/semi70", {"config": "acc85/semi70"})]
    assert report["n"] == 100 and report["complete"]
