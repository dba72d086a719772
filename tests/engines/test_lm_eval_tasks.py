"""An lm-eval grid over several tasks (``task: [arith, gsm8k_local]``, as a task group writes one
samples file per subtask): each task is a slice, whose V counts lm-eval's own samples. Two real
lm-eval runs of two local tasks each (tests/support/recorded_logs.py), offline."""
from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import recorded_logs
from redline_fakes import Project

import pytest_redline.engines.lm_eval_logs  # noqa: F401  (loaded before pytester's in-process runs)
import pytest_redline.runs  # noqa: F401

pytest_plugins = ["pytester"]
TASKS = ("arith", "gsm8k_local")
GRID = """\
name: lm-eval-two-tasks
engine: lm_eval
engine_args: {{task: [arith, gsm8k_local], metric: exact_match}}
cost: tokens_per_s
reference: ref
configs:
  ref:   {{path: {ref}, tokens_per_s: 1850}}
  short: {{path: {short}, tokens_per_s: 4100}}
deploy: fastest
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    import torch
    import torch.utils.collect_env as collect_env

    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(collect_env, "get_pretty_env_info", functools.lru_cache(collect_env.get_pretty_env_info))
        torch.set_num_threads(1)
        try:
            return recorded_logs.run_lm_eval_two_tasks(tmp_path_factory.mktemp("lm-eval-tasks"), patch)
        finally:
            torch.set_num_threads(threads)


def samples(folder: Path, task: str) -> dict[int, int]:
    path, = folder.rglob(f"samples_{task}_*.jsonl")
    return {s["doc_id"]: s["exact_match"] for s in map(json.loads, path.read_text().splitlines())}


@pytest.mark.slow  # two lm-eval runs of two tasks (16 docs each): lm-eval's import (shared) and the runs
def test_each_task_of_an_lm_eval_grid_is_a_slice(pytester, runs):
    project = Project(pytester)
    project.grid(GRID.format(**runs))
    result = project.run("--redline-alpha=0.3", "--redline-full", "--redline-report=report.json")  # every outcome read
    assert result.ret in (0, 1)
    report = project.report()
    assert report["n"] == sum(recorded_logs.GROUP_DOCS.values())
    (sliced,) = report["slices"]
    assert sliced["by"] == "prefix" and tuple(sliced["slices"]) == TASKS
    rows = {(r["config"], r["slice"]): r for r in sliced["rows"]}
    for task in TASKS:  # each slice's counts are lm-eval's own: docs the reference got right and short wrong
        ref, short = samples(runs["ref"], task), samples(runs["short"], task)
        assert rows[("short", task)]["violations"] == sum(ref[d] == 1 and short[d] == 0 for d in ref)
        assert rows[("ref", task)]["correct"] == sum(ref.values()) and rows[("ref", task)]["prompts"] == len(ref)
    short = next(c for c in report["configs"] if c["name"] == "short")
    assert sum(rows[("short", t)]["violations"] for t in TASKS) == short["violations"] > 0
    result.stdout.fnmatch_lines(["slices by prefix (2: arith, gsm8k_local): descriptive exact counts*"])
