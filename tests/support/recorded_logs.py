"""Real lm-eval and Inspect logs for the recorded-run engines' tests, produced in process.

lm-eval: a local ``generate_until`` task on a JSONL file of the arithmetic suite's calibration
problems (``question``: the suite's prompt text, ``answer``: its integer), run by
``lm_eval.simple_evaluate`` with lm-eval's own ``hf`` model on the embedded ``ar-target`` folder,
saved by lm-eval's ``EvaluationTracker`` as ``lm_eval --output_path ... --log_samples`` saves it.

Inspect: a local task on the same problems, run by ``inspect_ai.eval`` with its ``mockllm`` model
answering each problem with the suite's worked solution cut at a setting's character limit.

Nothing is downloaded (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE). Both packages import slowly (lm-eval
about 4-24 s), so each is imported once per session, by the fixture that uses it.
"""
from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest

import pytest_redline.engines
import pytest_redline.suites
from pytest_redline.suites.arithmetic import ArithmeticSuite

AR_TARGET = Path(pytest_redline.engines.__file__).parent / "models" / "ar-target"
GSM8K_DATA = Path(pytest_redline.suites.__file__).parent / "data" / "gsm8k_test.jsonl"  # the gsm8k suite's own file
GSM8K_DOCS = 8

N = 24  # documents: at alpha 0.2, delta 0.1 and m = 3, n >= 16 can certify
LM_EVAL_SETTINGS = {"ref": 128, "fast": 96, "short": 24}  # max_gen_toks; answers run to about 60 characters


def offline(patch: pytest.MonkeyPatch) -> None:
    """No download from here on (undone with ``patch``): the variables, and the flags that
    huggingface_hub and datasets read from them at import, when another test imported them first."""
    for variable in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        patch.setenv(variable, "1")
    for module, flag in (("huggingface_hub.constants", "HF_HUB_OFFLINE"), ("datasets.config", "HF_DATASETS_OFFLINE")):
        if module in sys.modules:
            patch.setattr(sys.modules[module], flag, True)


def problems(n: int = N) -> list[dict]:
    return [{"question": p.text, "answer": str(p.meta["answer"]), "solution": p.meta["solution"], "family": p.meta["family"]}
            for p in ArithmeticSuite(n=n).prompts()]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def lm_eval_task(data: Path, name: str = "arith", repeats: int = 1, sample: bool = False) -> dict:
    """The task as a team would write its YAML: the suite's prompt text, lm-eval's regex filter
    on the answer after '#', exact match."""
    generation = {"until": ["[EOS]"], "do_sample": sample, "max_gen_toks": 128}
    if sample:
        generation["temperature"] = 1.5
    return {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data)}},
        "test_split": "test",
        "output_type": "generate_until",
        "doc_to_text": "{{question}}",
        "doc_to_target": "{{answer}}",
        "generation_kwargs": generation,
        "repeats": repeats,
        "filter_list": [{"name": "answer", "filter": [{"function": "regex", "regex_pattern": "#(-?\\d+)"}]
                         + ([] if repeats > 1 else [{"function": "take_first"}])}],
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
    }


def run_lm_eval(root: Path, patch: pytest.MonkeyPatch) -> dict[str, Path]:
    """One ``--output_path`` folder per config: ref, fast and short (the settings above), changed
    (fast's setting on the data with one question changed), repeats (3 sampled repeats, 8 docs),
    and gsm8k (the first 8 problems of the gsm8k suite's own data, in its plain prompt format)."""
    offline(patch)
    import lm_eval
    import torch
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    torch.manual_seed(0)
    records = [{k: r[k] for k in ("question", "answer")} for r in problems()]
    data = write_jsonl(root / "arith.jsonl", records)
    changed = [dict(r) for r in records]
    changed[3]["question"] = changed[3]["question"].replace("=", " =")
    changed_data = write_jsonl(root / "arith_changed.jsonl", changed)
    model = HFLM(pretrained=str(AR_TARGET), dtype="float32", device="cpu", batch_size=N)
    manager = TaskManager(include_defaults=False)
    runs = {name: (lm_eval_task(data), f"max_gen_toks={tokens}") for name, tokens in LM_EVAL_SETTINGS.items()}
    runs["changed"] = (lm_eval_task(changed_data), f"max_gen_toks={LM_EVAL_SETTINGS['fast']}")
    runs["repeats"] = (lm_eval_task(write_jsonl(root / "arith8.jsonl", records[:8]), repeats=3, sample=True), None)
    gsm8k = {**lm_eval_task(GSM8K_DATA, "gsm8k_local"), "doc_to_text": "Question: {{question}}\nAnswer:",
             "doc_to_target": "{{answer.split('####')[-1].strip()}}"}
    runs["gsm8k"] = (gsm8k, "max_gen_toks=16")
    folders = {}
    for name, (task, gen_kwargs) in runs.items():
        folders[name] = root / name
        tracker = EvaluationTracker(output_path=str(folders[name]))
        results = lm_eval.simple_evaluate(model=model, tasks=[task], log_samples=True, evaluation_tracker=tracker,
                                          gen_kwargs=gen_kwargs, task_manager=manager, random_seed=0,
                                          numpy_random_seed=0, torch_random_seed=0,
                                          limit=GSM8K_DOCS if name == "gsm8k" else None)
        samples = results.pop("samples")
        tracker.save_results_aggregated(results=results, samples=samples)
        for task_name in results["configs"]:
            tracker.save_results_samples(task_name=task_name, samples=samples[task_name])
    return folders


GROUP_SETTINGS = {"ref": 128, "short": 24}  # max_gen_toks of the two-task runs
GROUP_DOCS = {"arith": 12, "gsm8k_local": 4}  # documents of each of the two tasks


def run_lm_eval_two_tasks(root: Path, patch: pytest.MonkeyPatch) -> dict[str, Path]:
    """One ``--output_path`` folder per setting of :data:`GROUP_SETTINGS`, each one lm-eval run of
    two local tasks together (as a task group writes one samples file per subtask): ``arith``
    (arithmetic problems) and ``gsm8k_local`` (the gsm8k suite's first problems), as many as
    :data:`GROUP_DOCS` says."""
    offline(patch)
    import lm_eval
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    arith = lm_eval_task(write_jsonl(root / "arith.jsonl", [{k: r[k] for k in ("question", "answer")}
                                                                  for r in problems(GROUP_DOCS["arith"])]))
    first = GSM8K_DATA.read_text().splitlines()[:GROUP_DOCS["gsm8k_local"]]
    (root / "gsm8k8.jsonl").write_text("".join(line + "\n" for line in first))
    gsm8k = {**lm_eval_task(root / "gsm8k8.jsonl", "gsm8k_local"), "doc_to_text": "Question: {{question}}\nAnswer:",
             "doc_to_target": "{{answer.split('####')[-1].strip()}}"}
    model = HFLM(pretrained=str(AR_TARGET), dtype="float32", device="cpu", batch_size=N)
    manager = TaskManager(include_defaults=False)
    folders = {}
    for name, tokens in GROUP_SETTINGS.items():
        folders[name] = root / name
        tracker = EvaluationTracker(output_path=str(folders[name]))
        results = lm_eval.simple_evaluate(model=model, tasks=[arith, gsm8k], log_samples=True, evaluation_tracker=tracker,
                                          gen_kwargs=f"max_gen_toks={tokens}", task_manager=manager, random_seed=0,
                                          numpy_random_seed=0, torch_random_seed=0)
        samples = results.pop("samples")
        tracker.save_results_aggregated(results=results, samples=samples)
        for task_name in results["configs"]:
            tracker.save_results_samples(task_name=task_name, samples=samples[task_name])
    return folders


def run_inspect(root: Path, patch: pytest.MonkeyPatch) -> dict[str, Path]:
    """One eval log per config: ref, fast (the same answers), short (answers cut at 24
    characters), changed (one input changed), epochs (3 epochs, answers varying), errored (one
    sample raised; the eval carries on) and failed (one sample raised; the eval failed). Besides
    ``match``, ref's constant scorers log each kind of value: bool, one, half, P, N and dict."""
    offline(patch)
    from inspect_ai import Task, eval as inspect_eval
    from inspect_ai.dataset import Sample
    from inspect_ai.model import ModelOutput, ModelUsage, get_model
    from inspect_ai.scorer import Score, match, scorer
    from inspect_ai.solver import generate, solver

    def constant(value, name):
        @scorer(metrics=[], name=name)
        def make():
            async def score(state, target):
                return Score(value=value)
            return score
        return make()

    kinds = [constant(True, "bool"), constant(1, "one"), constant(0.5, "half"), constant("P", "partial"),
             constant("N", "noanswer"), constant({"a": 1}, "dict")]
    solutions = {r["question"]: r["solution"] for r in problems()}

    def answers(limit, vary=False):
        calls = {}

        def output(messages, tools, tool_choice, config):
            question = messages[-1].text
            calls[question] = calls.get(question, 0) + 1
            text = solutions.get(question.replace(" =", "="), "no idea")[:limit]
            if vary and calls[question] <= len(question) % 3:
                text = text[:-1]  # 0, 1 or 2 epochs of 3 lose the last digit
            out = ModelOutput.from_content(model="mockllm/model", content=text)
            out.usage = ModelUsage(input_tokens=len(question), output_tokens=len(text), total_tokens=len(question) + len(text))
            return out
        return output

    @solver
    def crash_on(question):
        async def solve(state, generate_):
            if state.input_text == question:
                raise RuntimeError("the server went away")
            return state
        return solve

    records = problems()
    changed = [dict(r) for r in records]
    changed[3]["question"] = changed[3]["question"].replace("=", " =")
    settings = {
        "ref": (records, 200, {}, None), "fast": (records, 200, {}, None), "short": (records, 24, {}, None),
        "changed": (changed, 200, {}, None), "epochs": (records, 200, {"epochs": 3}, None),
        "errored": (records, 200, {"fail_on_error": False}, records[5]["question"]),
        "failed": (records, 200, {}, records[5]["question"]),
    }
    logs = {}
    for name, (data, limit, options, crash) in settings.items():
        dataset = [Sample(id=f"a{i}", input=r["question"], target=r["answer"], metadata={"family": r["family"]})
                   for i, r in enumerate(data)]
        solvers = ([crash_on(crash)] if crash else []) + [generate()]
        scorers = [match(location="end")] + (kinds if name == "ref" else [])
        task = Task(dataset=dataset, solver=solvers, scorer=scorers, name="arith")
        model = get_model("mockllm/model", custom_outputs=answers(limit, vary=name == "epochs"))
        with warnings.catch_warnings():  # inspect-ai 0.3.285 passes tenacity an argument it deprecated
            warnings.filterwarnings("ignore", "The 'initial' parameter is deprecated", DeprecationWarning)
            inspect_eval(task, model=model, log_dir=str(root / name), display="none", log_realtime=False,
                         score_display=False, **options)
        logs[name] = root / name
    return logs


LM_EVAL_GRID = """\
name: lm-eval-arith
engine: lm_eval
engine_args: {task: arith, metric: exact_match}
cost: tokens_per_s
direction: higher
reference: ref
configs:
  ref:   {path: lm-eval/ref, tokens_per_s: 1850}
  fast:  {path: lm-eval/fast, tokens_per_s: 2710}
  short: {path: lm-eval/short, tokens_per_s: 4100}
deploy: fastest
"""

INSPECT_GRID = """\
name: inspect-arith
engine: inspect
engine_args: {scorer: match}
cost: output_tokens
direction: lower
reference: ref
configs:
  ref:   {path: inspect/ref, output_tokens: output_tokens}
  fast:  {path: inspect/fast, output_tokens: output_tokens}
  short: {path: inspect/short, output_tokens: output_tokens}
deploy: fastest
"""

if __name__ == "__main__":  # python tests/support/recorded_logs.py OUT: the logs and a grid over each (docs/how-to/recorded-runs.md)
    out = Path(sys.argv[1])
    for name, run, grid in (("lm-eval", run_lm_eval, LM_EVAL_GRID), ("inspect", run_inspect, INSPECT_GRID)):
        (out / name).mkdir(parents=True, exist_ok=True)
        with pytest.MonkeyPatch.context() as patch:
            run(out / name, patch)
        (out / f"{name}.yaml").write_text(grid)
    (out / "changed.yaml").write_text(LM_EVAL_GRID.replace("lm-eval/fast,", "lm-eval/changed,"))  # one prompt differs: exit 4
