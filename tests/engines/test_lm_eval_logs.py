"""The ``lm_eval`` engine on logs that the real lm-eval writes in this session (tests/support/recorded_logs.py).

The gate over them exits 0, a setting that truncates answers has regressions, and a folder whose
one prompt differs exits 4 naming the folder and the doc; the model-free checks refuse every run
that cannot be gated, naming the file, the doc and what was expected.

Tests that use the logs are marked slow: the session fixture that writes them takes 10-15 s of CPU.
"""
from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest
import recorded_logs
from redline_fakes import Project

import pytest_redline.engines.lm_eval_logs  # noqa: F401  (loaded before pytester's in-process runs)
import pytest_redline.runs  # noqa: F401
from pytest_redline.decode.enginebook import EngineBook
from pytest_redline.engines.lm_eval_logs import LmEvalEngine
from pytest_redline.engines.recorded import RunError
from pytest_redline.suites.arithmetic import ArithmeticSuite
from pytest_redline.suites.math import GSM8K

pytest_plugins = ["pytester"]

ARGS = {"task": "arith", "metric": "exact_match"}
GRID = """\
name: lm-eval-arith
engine: lm_eval
engine_args: {{task: arith, metric: exact_match{extra}}}
{suite}cost: tokens_per_s
direction: higher
reference: ref
configs:
  ref:   {{path: {ref}, tokens_per_s: 1850}}
  fast:  {{path: {fast}, tokens_per_s: 2710}}
  short: {{path: {short}, tokens_per_s: 4100}}
deploy: fastest
"""


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The lm-eval runs, once per session: torch on one thread, and torch's environment report
    (which lm-eval writes into every results file: about 4 s of subprocesses) collected once."""
    import torch
    import torch.utils.collect_env as collect_env

    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(collect_env, "get_pretty_env_info", functools.lru_cache(collect_env.get_pretty_env_info))
        torch.set_num_threads(1)
        try:
            return recorded_logs.run_lm_eval(tmp_path_factory.mktemp("lm-eval"), patch)
        finally:
            torch.set_num_threads(threads)


@pytest.fixture
def project(pytester: pytest.Pytester) -> Project:
    return Project(pytester)


def samples(folder: Path, task: str = "arith") -> list[dict]:
    path, = folder.rglob(f"samples_{task}_*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def violations(runs: dict[str, Path], config: str) -> int:
    """V counted from lm-eval's own samples: docs the reference got right and the config wrong."""
    ref = {s["doc_id"]: s["exact_match"] for s in samples(runs["ref"])}
    return sum(ref[s["doc_id"]] == 1 and s["exact_match"] == 0 for s in samples(runs[config]))


def check(runs: dict[str, Path], args=None, **configs: dict) -> tuple[list, dict[str, str]]:
    configs = configs or {"ref": {"path": str(runs["ref"]), "tokens_per_s": 1.0}}
    return LmEvalEngine.check_runs({**ARGS, **(args or {})}, configs, reference=next(iter(configs)), cost="tokens_per_s")


def copy_run(runs: dict[str, Path], name: str, to: Path, edit=None) -> Path:
    """A copy of a run's folder, optionally with its samples' records edited (edit(records))."""
    shutil.copytree(runs[name], to)
    if edit is not None:
        path, = to.rglob("samples_arith_*.jsonl")
        records = [json.loads(line) for line in path.read_text().splitlines()]
        edit(records)
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return to


@pytest.mark.slow
def test_gate_over_lm_eval_runs(project: Project, runs: dict[str, Path]) -> None:
    short = violations(runs, "short")
    assert short > 0 and violations(runs, "fast") == 0  # the truncating setting loses answers
    project.grid(GRID.format(extra="", suite="", **runs))
    result = project.run("--redline-alpha=0.2", "--redline-full", "--redline-report=report.json")
    assert result.ret == 0, result.stdout.str()
    report = project.report()
    by_name = {c["name"]: c for c in report["configs"]}
    assert report["n"] == recorded_logs.N and report["deployed"] == "fast"
    assert by_name["short"]["violations"] == short and not by_name["short"]["valid"]
    assert by_name["fast"]["violations"] == 0 and by_name["fast"]["valid"]
    assert by_name["ref"]["accuracy"] == sum(s["exact_match"] for s in samples(runs["ref"])) / recorded_logs.N
    assert len(by_name["fast"]["params"]["logs_sha256"]) == 64  # the run's file hashes, in the outcome key

    # the key: the same logs are served from the store; a changed log is read again
    book = EngineBook()
    assert book.identity("lm_eval", ARGS)["fingerprint"] == LmEvalEngine(**ARGS).fingerprint() and not book.built_any
    again = project.run("--redline-alpha=0.2", "--redline-full")
    again.stdout.fnmatch_lines([f"outcomes: replayed (lm_eval): 0 read from the recorded outcomes, {3 * recorded_logs.N} "
                                "reused from the store, none decoded"])
    doc = next(s["doc_id"] for s in samples(runs["short"]) if s["exact_match"] == 0)
    fixed = copy_run(runs, "short", project.path / "fixed",
                     edit=lambda rs: [r.update(exact_match=1.0) for r in rs if r["doc_id"] == doc])
    project.grid(GRID.format(extra="", suite="", **{**runs, "short": fixed}))
    edited = project.run("--redline-alpha=0.2", "--redline-full", "--redline-report=edited.json")
    edited.stdout.fnmatch_lines([f"outcomes: replayed (lm_eval): {recorded_logs.N} read from the recorded outcomes, "
                                 f"{2 * recorded_logs.N} reused from the store, none decoded"])
    edited_short = next(c for c in project.report("edited.json")["configs"] if c["name"] == "short")
    ref_right = next(s["exact_match"] == 1 for s in samples(runs["ref"]) if s["doc_id"] == doc)
    assert edited_short["violations"] == short - ref_right

    # rescore: the arithmetic suite's judge on lm-eval's raw responses; it agrees with the regex filter here
    project.grid(GRID.format(extra=", rescore: true", suite=f"suite: arithmetic\nsuite_args: {{n: {recorded_logs.N}}}\n", **runs))
    result = project.run("--redline-alpha=0.2", "--redline-full", "--redline-report=rescored.json")
    assert result.ret == 0, result.stdout.str()
    rescored = {c["name"]: c for c in project.report("rescored.json")["configs"]}
    assert rescored["short"]["violations"] == short and rescored["fast"]["violations"] == 0


@pytest.mark.slow
def test_every_outcome_is_read_without_redline_full(project: Project, runs: dict[str, Path]) -> None:
    """lm_eval declares read_every_outcome: a run without --redline-full reads every log entry (no
    early stop), so each V is the exact count that lm-eval's samples give, as --redline-full's."""
    project.grid(GRID.format(extra="", suite="", **runs))
    result = project.run("--redline-alpha=0.2", "--redline-report=report.json")
    assert result.ret == 0, result.stdout.str()
    report = project.report()
    assert {c["name"]: (c["violations"], c["violations_bound"], c["prompts_run"]) for c in report["configs"]} == {
        name: (violations(runs, name) if name != "ref" else 0, "exact", recorded_logs.N) for name in ("ref", "fast", "short")}
    assert report["schedule"]["mode"].startswith("full: every outcome read")
    result.stdout.fnmatch_lines(["schedule: full: every outcome read (its engine reads recorded outcomes at no cost, so V is exact)"])


@pytest.mark.slow
def test_a_folder_with_one_changed_prompt_exits_4(project: Project, runs: dict[str, Path]) -> None:
    project.grid(GRID.format(extra="", suite="", **{**runs, "fast": runs["changed"]}))
    result = project.run("--redline-alpha=0.2")
    assert result.ret == 4
    result.stderr.fnmatch_lines([f"*configs.fast.path: {runs['changed']}: doc 3: doc_hash * differs from the reference's "
                                 f"({runs['ref']}: *); expected the same prompts in every config*"])


@pytest.mark.slow
def test_own_prompts_and_digests(runs: dict[str, Path]) -> None:
    configs = {name: {"path": str(runs[name]), "tokens_per_s": 1.0} for name in ("ref", "fast", "short")}
    prompts, checked = check(runs, **configs)
    digests = {name: values["logs_sha256"] for name, values in checked.items()}
    assert [p.id for p in prompts] == [f"arith/{i}" for i in range(recorded_logs.N)]
    assert [p.text for p in prompts] == [p.text for p in ArithmeticSuite(n=recorded_logs.N).prompts()]
    assert len(set(digests.values())) == 3
    engine = LmEvalEngine(**ARGS)
    out = engine.generate(prompts[:3], {**configs["short"], "logs_sha256": digests["short"]})
    recorded = samples(runs["short"])[:3]
    assert [g.correct for g in out] == [s["exact_match"] == 1 for s in recorded]
    assert [g.text for g in out] == [s["resps"][0][0] for s in recorded]
    assert all(g.extra == {"tokens_per_s": 1.0} for g in out)
    with pytest.raises(ValueError, match="changed since the grid was checked"):
        engine.generate(prompts[:1], {**configs["short"], "logs_sha256": digests["ref"]})


@pytest.mark.slow
def test_several_runs_in_one_folder_need_run(runs: dict[str, Path], tmp_path: Path) -> None:
    folder = copy_run(runs, "ref", tmp_path / "ref")
    first, = folder.rglob("samples_arith_*.jsonl")
    stamp = first.name.removeprefix("samples_arith_").removesuffix(".jsonl")
    again = "2027-01-01T00-00-00.000001"
    shutil.copy(first, first.with_name(f"samples_arith_{again}.jsonl"))
    shutil.copy(first.with_name(f"results_{stamp}.json"), first.with_name(f"results_{again}.json"))
    configs = {"ref": {"path": str(folder), "tokens_per_s": 1.0}}
    with pytest.raises(RunError, match=rf"{folder}: 2 samples files of task 'arith' \(.*{stamp}.*{again}.*\); "
                                       "expected one: pass engine_args.run"):
        check(runs, **configs)
    prompts, _ = check(runs, {"run": stamp}, **configs)
    assert len(prompts) == recorded_logs.N


@pytest.mark.parametrize("args, message", [
    ({"task": "nope"}, r"no samples file of task 'nope' .*tasks found: arith"),
    ({"metric": "f1"}, r"no metric 'f1' \(filter 'answer'\); metrics: exact_match"),
    ({"filter": "strict"}, r"no docs of filter 'strict'; filters: answer"),
])
@pytest.mark.slow
def test_missing_task_metric_or_filter(runs: dict[str, Path], args: dict, message: str) -> None:
    with pytest.raises(RunError, match=message):
        check(runs, args)


@pytest.mark.slow
def test_values_must_be_binary(runs: dict[str, Path], tmp_path: Path) -> None:
    folder = copy_run(runs, "ref", tmp_path / "ref", edit=lambda rs: rs[7].update(exact_match=0.5))
    with pytest.raises(RunError, match=rf"{folder}/.*samples_arith_.*: doc 7: exact_match: expected 0 or 1 "
                                       r"\(a binary metric\), got 0.5"):
        check(runs, ref={"path": str(folder), "tokens_per_s": 1.0})


@pytest.mark.slow
def test_unpaired_docs_exit(runs: dict[str, Path], tmp_path: Path) -> None:
    folder = copy_run(runs, "fast", tmp_path / "fast", edit=lambda rs: rs.pop(5))
    configs = {"ref": {"path": str(runs["ref"]), "tokens_per_s": 1.0}, "fast": {"path": str(folder), "tokens_per_s": 2.0}}
    with pytest.raises(RunError, match=rf"{folder}: no doc 5, which the reference's run \({runs['ref']}\) has") as e:
        check(runs, **configs)
    assert e.value.key == "configs.fast.path"


@pytest.mark.slow
def test_a_config_without_its_cost(runs: dict[str, Path]) -> None:
    with pytest.raises(RunError, match="expected a parameter 'tokens_per_s' .the grid's cost.") as e:
        check(runs, ref={"path": str(runs["ref"]), "latency": 3.0})
    assert e.value.key == "configs.ref"


@pytest.mark.slow
def test_repeats_need_a_declared_reducer(runs: dict[str, Path]) -> None:
    configs = {"rep": {"path": str(runs["repeats"]), "tokens_per_s": 1.0}}
    with pytest.raises(RunError, match=r"samples_arith_.*: doc 0: 3 repeats; expected engine_args.reducer \(all, any, mode\)"):
        check(runs, **configs)
    recorded = samples(runs["repeats"])
    right = [sum(answer == s["target"] for answer in s["filtered_resps"][0]) for s in recorded]  # per doc, of 3
    assert {s["exact_match"] for s in recorded} <= {0, 1 / 3, 2 / 3, 1}
    for reducer, rule in (("all", lambda k: k == 3), ("any", lambda k: k > 0), ("mode", lambda k: k >= 2)):
        prompts, _ = check(runs, {"reducer": reducer}, **configs)
        out = LmEvalEngine(**ARGS, reducer=reducer).generate(prompts, configs["rep"])
        assert [g.correct for g in out] == [rule(k) for k in right]


@pytest.mark.slow
def test_rescore_checks_the_suite_against_the_docs(runs: dict[str, Path]) -> None:
    configs = {"ref": {"path": str(runs["ref"]), "tokens_per_s": 1.0}}
    kwargs = {"reference": "ref", "cost": "tokens_per_s"}
    suite = ArithmeticSuite(n=recorded_logs.N).prompts()
    prompts, _ = LmEvalEngine.check_runs({**ARGS, "rescore": True}, configs, prompts=suite, **kwargs)
    out = LmEvalEngine(**ARGS, rescore=True).generate(prompts[:2], configs["ref"])
    assert [g.correct for g in out] == [None, None] and out[1].text == samples(runs["ref"])[1]["resps"][0][0]
    with pytest.raises(RunError, match=r"doc 0 \(the suite's prompt 'arithmetic/cal/0'\): the doc's question .* is not in "
                                       "the suite's prompt"):
        LmEvalEngine.check_runs({**ARGS, "rescore": True}, configs, prompts=ArithmeticSuite(n=24, seed=1).prompts(), **kwargs)
    with pytest.raises(RunError, match=r"no doc 24 for the suite's prompt 'arithmetic/cal/24'"):
        LmEvalEngine.check_runs({**ARGS, "rescore": True}, configs, prompts=ArithmeticSuite(n=25).prompts(), **kwargs)
    with pytest.raises(RunError, match="rescore: true needs the grid's suite"):
        LmEvalEngine.check_runs({**ARGS, "rescore": True}, configs, **kwargs)


def test_one_engine_for_every_config(project: Project) -> None:
    """Refused before any log is read: a config with engine_args of its own."""
    project.grid(GRID.format(extra="", suite="", ref="a", fast="b", short="c").replace(
        "tokens_per_s: 4100}", "tokens_per_s: 4100, engine_args: {filter: answer}}"))
    result = project.run("--redline-alpha=0.2")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*redline.yaml: configs: expected one engine and the same engine_args for every config "
                                 "of a grid over recorded runs, got 2*"])


@pytest.mark.parametrize("params, message", [
    ({"tokens_per_s": 1.0}, "path: expected the path of the config's run"),
    ({"path": "x", "tokens_per_s": True}, "tokens_per_s: expected a cost"),
    ({"path": "x", "logs_sha256": "ab"}, "logs_sha256: reserved"),
])
def test_check_config(params: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LmEvalEngine.check_config(params)


@pytest.mark.parametrize("args, message", [
    ({"metric": "exact_match"}, "engine_args.task: expected a non-empty string"),
    ({**ARGS, "reducer": "mean"}, "engine_args.reducer: expected one of all, any, mode"),
    ({**ARGS, "rescore": "yes"}, "engine_args.rescore: expected true or false"),
    ({**ARGS, "filters": "x"}, "unknown engine argument 'filters'"),
])
def test_check_engine_args(args: dict, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        LmEvalEngine.check_engine_args(args)


@pytest.mark.slow
def test_rescore_gsm8k_docs_with_the_suite_judge(runs: dict[str, Path], tmp_path: Path) -> None:
    """The issue's example: GSM8K docs re-judged by the gsm8k suite, whose prompts (few-shot too)
    match the docs by doc_id, question and gold answer; a suite whose records are shifted does not."""
    args = {"task": "gsm8k_local", "metric": "exact_match", "rescore": True}
    configs = {"ref": {"path": str(runs["gsm8k"]), "tokens_per_s": 1.0}}
    suite = GSM8K(ids=list(range(recorded_logs.GSM8K_DOCS)), few_shot=1)
    prompts, _ = LmEvalEngine.check_runs(args, configs, reference="ref", cost="tokens_per_s", prompts=suite.prompts())
    out = LmEvalEngine(**args).generate(prompts, configs["ref"])
    recorded = {s["doc_id"]: s["resps"][0][0] for s in samples(runs["gsm8k"], "gsm8k_local")}
    assert [g.text for g in out] == [recorded[i] for i in range(recorded_logs.GSM8K_DOCS)]
    assert all(g.correct is None for g in out) and all(suite.judge(p, g.text).rule for p, g in zip(prompts, out))
    lines = recorded_logs.GSM8K_DATA.read_text().splitlines()[:recorded_logs.GSM8K_DOCS + 1]
    for name, records, message in (
        ("shifted", lines[1:] + lines[:1], r"doc 0 \(the suite's prompt 'gsm8k/0'\): the doc's question 'Janet.*' is not in "
                                           "the suite's prompt"),
        ("gold", [lines[0].replace("#### 18", "#### 19")] + lines[1:],
         r"doc 0 \(the suite's prompt 'gsm8k/0'\): the doc's gold answer '18' differs from the suite's '19'"),
    ):
        (tmp_path / f"{name}.jsonl").write_text("\n".join(records) + "\n")
        other = GSM8K(path=str(tmp_path / f"{name}.jsonl"), ids=list(range(recorded_logs.GSM8K_DOCS))).prompts()
        with pytest.raises(RunError, match=message):
            LmEvalEngine.check_runs(args, configs, reference="ref", cost="tokens_per_s", prompts=other)
