"""The ``inspect`` engine on eval logs that the real inspect_ai writes in this session, with its
``mockllm`` model (tests/support/recorded_logs.py): the gate over them exits 0, answers cut short have
regressions, a log whose one input differs exits 4 naming it and the sample, and logs that cannot be
gated (non-binary scores, errors, a failed run, epochs without a reducer) are refused model-free.

Tests that use the logs are marked slow: the session fixture that writes them takes 10-15 s of CPU.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import recorded_logs
from redline_fakes import Project

import pytest_redline.engines.inspect_logs  # noqa: F401  (loaded before pytester's in-process runs)
import pytest_redline.runs  # noqa: F401
from pytest_redline.engines.inspect_logs import InspectEngine
from pytest_redline.engines.recorded import RunError
from pytest_redline.suites.arithmetic import ArithmeticSuite

pytest_plugins = ["pytester"]

GRID = """\
name: inspect-arith
engine: inspect
engine_args: {{scorer: match}}
cost: output_tokens
direction: lower
reference: ref
configs:
  ref:   {{path: {ref}, output_tokens: output_tokens}}
  fast:  {{path: {fast}, output_tokens: output_tokens}}
  short: {{path: {short}, output_tokens: output_tokens}}
deploy: fastest
"""


@pytest.fixture(scope="session")
def logs(tmp_path_factory) -> dict[str, Path]:
    import inspect_ai.log  # noqa: F401  (the engine's reader, loaded before pytester's in-process runs)

    with pytest.MonkeyPatch.context() as patch:
        return recorded_logs.run_inspect(tmp_path_factory.mktemp("inspect"), patch)


@pytest.fixture
def project(pytester: pytest.Pytester) -> Project:
    return Project(pytester)


def scores(folder: Path, scorer: str = "match") -> dict[str, list]:
    """Each sample id's values of ``scorer``, one per epoch, read with Inspect's own reader."""
    from inspect_ai.log import read_eval_log

    path, = folder.glob("*.eval")
    out: dict[str, list] = {}
    for sample in read_eval_log(str(path)).samples:
        out.setdefault(str(sample.id), []).append(sample.scores[scorer].value)
    return out


def check(logs: dict[str, Path], args=None, **configs: str):
    configs = {name: {"path": str(logs[run]), "tokens_per_s": 1.0} for name, run in (configs or {"ref": "ref"}).items()}
    return InspectEngine.check_runs({"scorer": "match", **(args or {})}, configs, reference=next(iter(configs)),
                                    cost="tokens_per_s")


@pytest.mark.slow
def test_gate_over_inspect_logs(project: Project, logs: dict[str, Path]) -> None:
    ref, short = scores(logs["ref"]), scores(logs["short"])
    expected = sum(ref[i] == ["C"] and short[i] == ["I"] for i in ref)
    assert expected > 0
    project.grid(GRID.format(**logs))
    result = project.run("--redline-alpha=0.2", "--redline-report=report.json")  # no --redline-full: inspect reads all
    assert result.ret == 0, result.stdout.str()
    report = project.report()
    by_name = {c["name"]: c for c in report["configs"]}
    assert report["schedule"]["mode"].startswith("full: every outcome read")
    assert all(c["violations_bound"] == "exact" and c["prompts_run"] == recorded_logs.N for c in report["configs"])
    assert report["n"] == recorded_logs.N and report["deployed"] == "ref"  # fast is no cheaper: the reference wins ties
    assert by_name["short"]["violations"] == expected and not by_name["short"]["valid"]
    assert by_name["fast"]["violations"] == 0 and by_name["fast"]["valid"]
    assert by_name["short"]["cost"] < by_name["ref"]["cost"]  # fewer output tokens, per sample, from the log
    assert 0 < by_name["short"]["accuracy"] < 1
    # slice_by a named Inspect metadata field: the samples' families, whose V add up to short's
    project.grid(GRID.format(**logs) + "slice_by: family\n")
    result = project.run("--redline-alpha=0.2", "--redline-full", "--redline-report=report.json")
    (sliced,) = project.report()["slices"]
    families = {p.meta["family"] for p in ArithmeticSuite(n=recorded_logs.N).prompts()}
    assert sliced["by"] == "family" and set(sliced["slices"]) == families and len(families) > 1
    assert sum(r["violations"] for r in sliced["rows"] if r["config"] == "short") == expected


@pytest.mark.slow
def test_a_log_with_one_changed_input_exits_4(project: Project, logs: dict[str, Path]) -> None:
    project.grid(GRID.format(**{**logs, "fast": logs["changed"]}))
    result = project.run("--redline-alpha=0.2")
    assert result.ret == 4
    result.stderr.fnmatch_lines([f"*configs.fast.path: {logs['changed']}: sample a3: input * differs from the "
                                 f"reference's ({logs['ref']}: *); expected the same prompts in every config*"])


@pytest.mark.slow
def test_own_prompts_and_outcomes(logs: dict[str, Path]) -> None:
    prompts, checked = check(logs, ref="ref", short="short")
    assert checked["short"]["logs_sha256"] != checked["ref"]["logs_sha256"]
    assert sorted(p.id for p in prompts) == sorted(f"arith/a{i}" for i in range(recorded_logs.N))  # in the log's order
    questions = [r["question"] for r in recorded_logs.problems()]
    assert [p.text for p in prompts] == [questions[int(p.id.removeprefix("arith/a"))] for p in prompts]
    out = InspectEngine(scorer="match").generate(prompts, {"path": str(logs["short"]), "tokens": "output_tokens"})
    short = scores(logs["short"])
    assert [g.correct for g in out] == [short[p.id.removeprefix("arith/")] == ["C"] for p in prompts]
    assert [g.extra["tokens"] for g in out] == [len(g.text) for g in out]  # the mock's usage: one token a character


@pytest.mark.slow
@pytest.mark.parametrize("scorer, ok", [("bool", True), ("one", True), ("half", False), ("partial", False),
                                        ("noanswer", False), ("dict", False)])
def test_scores_must_be_binary(logs: dict[str, Path], scorer: str, ok: bool) -> None:
    if ok:
        prompts, _ = check(logs, {"scorer": scorer})
        assert len(prompts) == recorded_logs.N
        return
    value = {"half": "0.5", "partial": "'P'", "noanswer": "'N'", "dict": "{'a': 1}"}[scorer]
    with pytest.raises(RunError, match=rf"sample a0 \(epoch 1\): score '{scorer}': expected a binary value "
                                       rf"\(C or I, true or false, 0 or 1\), got {value}"):
        check(logs, {"scorer": scorer})


@pytest.mark.slow
def test_a_missing_score_is_not_a_wrong_answer(logs: dict[str, Path]) -> None:
    with pytest.raises(RunError, match=r"sample a0 \(epoch 1\): no score 'includes'; scores: match"):
        check(logs, {"scorer": "includes"}, fast="fast")


@pytest.mark.slow
def test_errors_and_failed_runs_exit(logs: dict[str, Path]) -> None:
    with pytest.raises(RunError, match=r"sample a5 \(epoch 1\): error .*the server went away.*; expected a sample "
                                       "that ran to its score"):
        check(logs, errored="errored")
    with pytest.raises(RunError, match=r"status 'error'; expected 'success'"):
        check(logs, failed="failed")


@pytest.mark.slow
def test_epochs_need_a_declared_reducer(logs: dict[str, Path]) -> None:
    with pytest.raises(RunError, match=r"sample a\d+: 3 epochs; expected engine_args.reducer \(all, any, mode\)"):
        check(logs, epochs="epochs")
    right = {i: values.count("C") for i, values in scores(logs["epochs"]).items()}
    assert set(right.values()) >= {1, 2, 3}  # the epochs differ
    for reducer, rule in (("all", lambda k: k == 3), ("any", lambda k: k > 0), ("mode", lambda k: k >= 2)):
        prompts, _ = check(logs, {"reducer": reducer}, epochs="epochs")
        out = InspectEngine(scorer="match", reducer=reducer).generate(prompts, {"path": str(logs["epochs"])})
        assert [g.correct for g in out] == [rule(right[p.id.split("/")[-1]]) for p in prompts]


@pytest.mark.slow
def test_a_folder_must_hold_one_log(logs: dict[str, Path]) -> None:
    with pytest.raises(RunError, match=rf"{logs['ref'].parent}: \d+ eval logs \(.*\); expected one"):
        InspectEngine.check_runs({"scorer": "match"}, {"ref": {"path": str(logs["ref"].parent), "c": 1}},
                                 reference="ref", cost="c")


@pytest.mark.slow
def test_a_per_sample_cost_must_be_a_number(logs: dict[str, Path]) -> None:
    with pytest.raises(RunError, match=r"sample a\d+: cost 'tokens': expected a finite number in the per-sample field "
                                       r"'latency', got None") as e:
        InspectEngine.check_runs({"scorer": "match"}, {"ref": {"path": str(logs["ref"]), "tokens": "latency"}},
                                 reference="ref", cost="tokens")
    assert e.value.key == "configs.ref.tokens"
