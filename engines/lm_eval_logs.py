"""The ``lm_eval`` engine: lm-evaluation-harness ``--log_samples`` output as recorded outcomes.

    engine: lm_eval
    engine_args: {task: gsm8k, metric: exact_match, filter: flexible-extract}
    cost: tokens_per_s
    direction: higher
    reference: bf16
    configs:
      bf16: {path: runs/bf16, tokens_per_s: 1850}
      fp8:  {path: runs/fp8,  tokens_per_s: 2710}

``task: [a, b]`` gates several tasks' docs together, as a task group (MMLU's subtasks) writes one
samples file per task: the prompt ids are ``<task>/<doc_id>``, so each task is a slice of the
report (pytest_redline.slices).

Each config's ``path`` is the ``--output_path`` of its lm-eval run; ``results_<time>.json`` and
``samples_<task>_<time>.jsonl`` are found anywhere under it (lm-eval adds a folder named after the
model). There must be one samples file of the task, or ``run: <time>`` picks one. ``filter`` may be
omitted when the task has one filter. The unit is the document (``doc_id``), paired across configs
by ``doc_hash`` and ``prompt_hash``; its metric value must be 0 or 1. With ``repeats`` r > 1 (the
task's config in the results file) the value is the mean over the repeats, k/r, and the declared
``reducer`` decides (``all``: k = r, ``any``: k > 0, ``mode``: k > r/2).

``rescore: true`` returns each document's raw response (``resps``) with no judgement, for the grid's
``suite`` to judge; the suite's prompts are matched to documents by ``doc_id`` (the last segment of
the prompt id) and checked against the document's ``question`` and ``answer`` (its gold after a
final ``####``). Parsed without importing lm_eval (whose import takes seconds).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any, Mapping

from pytest_redline.contracts import Prompt
from pytest_redline.engines.recorded import (
    RecordedRuns, Run, RunError, Unit, check_name, check_reducer, digest, reduce, short,
)

TIME = r"\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}(?:\.\d+)?"  # lm-eval's date_id: isoformat with ':' -> '-'
QUESTION, ANSWER = "question", "answer"  # the document keys a re-scored suite prompt is checked against


class LmEvalEngine(RecordedRuns):
    name = "lm_eval"
    what = "docs"

    @classmethod
    def parse_args(cls, engine_args: Mapping[str, Any]) -> dict[str, Any]:
        known = ("task", "metric", "filter", "rescore", "reducer", "run")
        unknown = sorted(set(engine_args) - set(known))
        if unknown:
            raise TypeError(f"lm_eval: unknown engine argument {unknown[0]!r}; known: {', '.join(known)}")
        args = {"filter": None, "rescore": False, "reducer": None, "run": None, **engine_args}
        args["task"] = _tasks(args.get("task"))
        check_name(cls.name, "metric", args.get("metric"))
        for key in ("filter", "run"):
            check_name(cls.name, key, args[key], required=False)
        if not isinstance(args["rescore"], bool):
            raise ValueError(f"lm_eval: engine_args.rescore: expected true or false, got {args['rescore']!r}")
        check_reducer(cls.name, args["reducer"])
        return args

    @classmethod
    def read(cls, path: str, args: Mapping[str, Any], key: str) -> tuple[Run, str]:
        """One task's run (its prompt ids ``<task>/<doc_id>``), or several tasks' docs together,
        each unit keyed ``<task>/<doc_id>`` (then the task is ""): each task is a slice."""
        tasks = args["task"]
        if isinstance(tasks, str):
            return cls._read_task(path, tasks, args, key)
        units, digests = {}, []
        for task in tasks:
            run, _ = cls._read_task(path, task, args, key)
            units.update({f"{task}/{k}": dataclasses.replace(u, key=f"{task}/{k}") for k, u in run.units.items()})
            digests.append(run.digest)
        return Run(str(path), units, hashlib.sha256("".join(digests).encode()).hexdigest()), ""

    @classmethod
    def _read_task(cls, path: str, task: str, args: Mapping[str, Any], key: str) -> tuple[Run, str]:
        samples = _one_samples_file(Path(path), task, args["run"], key)
        stamp = re.fullmatch(rf"samples_{re.escape(task)}_({TIME})\.jsonl", samples.name).group(1)
        results = samples.parent / f"results_{stamp}.json"
        config = _task_config(results, task, key)
        repeats = config.get("repeats", 1)
        if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
            raise RunError(key, f"{results}: configs.{task}.repeats: expected an int >= 1, got {repeats!r}")
        records = _records(samples, key)
        records = _of_filter(records, args["filter"], samples, key, args["metric"])
        units: dict[str, Unit] = {}
        for line, record in records:
            unit = _unit(record, args, repeats, samples, line, key)
            if unit.key in units:
                raise RunError(key, f"{samples}: line {line}: doc {unit.key} again; expected one line per doc and filter")
            units[unit.key] = unit
        if not units:
            raise RunError(key, f"{samples}: no docs")
        return Run(str(path), units, digest([samples, results])), task

    @classmethod
    def match(cls, prompt: Prompt, unit: Unit, source: str, args: Mapping[str, Any]) -> None:
        doc = unit.doc or {}
        question, answer = doc.get(QUESTION), doc.get(ANSWER)
        where = f"{source}: doc {unit.key} (the suite's prompt {prompt.id!r})"
        if not isinstance(question, str) or answer is None:
            raise RunError("suite", f"{where}: expected the doc's {QUESTION!r} and {ANSWER!r} to check it against the "
                                    f"suite's prompt, got keys {sorted(doc)}")
        if question.strip() not in prompt.text:
            raise RunError("suite", f"{where}: the doc's question {question.strip()[:60]!r} is not in the suite's prompt "
                                    f"{prompt.text[-80:]!r}; expected the suite's prompts to be the run's docs")
        gold, expected = _number_text(str(answer).rsplit("####", 1)[-1]), _number_text(str(prompt.meta.get("answer")))
        if gold != expected:
            raise RunError("suite", f"{where}: the doc's gold answer {gold!r} differs from the suite's {expected!r}")


def _tasks(value: Any) -> str | tuple[str, ...]:
    """``task``: one task's name, or a list of distinct names (a task group's subtasks, one samples
    file each)."""
    if isinstance(value, (list, tuple)) and value and all(isinstance(t, str) and t.strip() for t in value):
        if len(set(value)) < len(value):
            raise ValueError(f"lm_eval: engine_args.task: expected distinct task names, got {list(value)!r}")
        return tuple(value)
    check_name(LmEvalEngine.name, "task", value)
    return value


def _number_text(text: str) -> str:
    return re.sub(r"[\s$,]", "", text)


def _one_samples_file(folder: Path, task: str, run: str | None, key: str) -> Path:
    if not folder.is_dir():
        raise RunError(key, f"{folder}: expected the folder of an lm-eval run (its --output_path), which does not exist")
    pattern = re.compile(rf"samples_{re.escape(task)}_({TIME})\.jsonl")
    found = sorted(p for p in folder.rglob("samples_*.jsonl") if pattern.fullmatch(p.name))
    if run is not None:
        found = [p for p in found if pattern.fullmatch(p.name).group(1) == run]
    if len(found) == 1:
        return found[0]
    if found:
        names = ", ".join(str(p.relative_to(folder)) for p in found)
        raise RunError(key, f"{folder}: {len(found)} samples files of task {task!r} ({names}); expected one: "
                            "pass engine_args.run: <the time in a file name> to pick one")
    tasks = sorted({re.sub(rf"_{TIME}\.jsonl$", "", p.name)[len("samples_"):] for p in folder.rglob("samples_*.jsonl")})
    picked = f" of run {run!r}" if run is not None else ""
    raise RunError(key, f"{folder}: no samples file of task {task!r}{picked} (samples_{task}_<time>.jsonl, written by "
                        f"lm-eval --log_samples); tasks found: {', '.join(tasks) or 'none'}")


def _task_config(results: Path, task: str, key: str) -> Mapping[str, Any]:
    try:
        data = json.loads(results.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunError(key, f"{results}: no such file; expected the results file of the samples' run") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunError(key, f"{results}: cannot read the results file ({e})") from None
    config = data.get("configs", {}).get(task) if isinstance(data, dict) else None
    if not isinstance(config, dict):
        raise RunError(key, f"{results}: configs: expected the config of task {task!r}")
    return config


def _records(samples: Path, key: str) -> list[tuple[int, dict]]:
    out = []
    with open(samples, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise RunError(key, f"{samples}: line {number}: not JSON ({e.msg})") from None
            if not isinstance(record, dict):
                raise RunError(key, f"{samples}: line {number}: expected a JSON object")
            out.append((number, record))
    return out


def _of_filter(records: list[tuple[int, dict]], chosen: str | None, samples: Path, key: str, metric: str):
    filters = list(dict.fromkeys(str(r.get("filter")) for _, r in records))
    if chosen is None:
        if len(filters) > 1:
            raise RunError(key, f"{samples}: the task has {len(filters)} filters ({', '.join(filters)}); "
                                "expected engine_args.filter to name one")
        chosen = filters[0] if filters else None
    picked = [(n, r) for n, r in records if str(r.get("filter")) == chosen]
    if not picked:
        raise RunError(key, f"{samples}: no docs of filter {chosen!r}; filters: {', '.join(filters)}")
    metrics = sorted({m for _, r in picked for m in r.get("metrics", ())})
    if not any(metric in r for _, r in picked):
        raise RunError(key, f"{samples}: no metric {metric!r} (filter {chosen!r}); metrics: {', '.join(metrics) or 'none'}")
    return picked


def _unit(record: Mapping[str, Any], args: Mapping[str, Any], repeats: int, samples: Path, line: int, key: str) -> Unit:
    doc_id = record.get("doc_id")
    if isinstance(doc_id, bool) or not isinstance(doc_id, int):
        raise RunError(key, f"{samples}: line {line}: doc_id: expected an int, got {doc_id!r}")
    where = f"{samples}: doc {doc_id}"
    hashes = {name: record.get(name) for name in ("doc_hash", "prompt_hash")}
    for name, value in hashes.items():
        if not isinstance(value, str) or not value:
            raise RunError(key, f"{where}: {name}: expected lm-eval's hash of the doc and the prompt, got {value!r}")
    texts = _responses(record.get("resps"), where, key)
    if args["rescore"]:
        if repeats != 1 or len(texts) != 1:
            raise RunError(key, f"{where}: {len(texts)} responses (repeats {repeats}); rescore: true judges one "
                                "response per doc, so expected repeats 1")
        correct, text = None, texts[0]
    else:
        correct = _judgement(record.get(args["metric"]), args, repeats, where, key)
        text = texts[0] if len(texts) == 1 else "\n".join(f"[repeat {i + 1}] {t}" for i, t in enumerate(texts))
    prompt = _prompt_text(record.get("arguments"))
    doc = record.get("doc") if isinstance(record.get("doc"), dict) else None
    return Unit(str(doc_id), prompt, hashes, correct, text, record, doc)


def _judgement(value: Any, args: Mapping[str, Any], repeats: int, where: str, key: str) -> bool:
    """The doc's verdict: its value is 0 or 1, or with repeats the fraction k/r that were right."""
    metric = args["metric"]
    if isinstance(value, bool):
        value = int(value)
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RunError(key, f"{where}: {metric}: expected 0 or 1, got {value!r}")
    right = value * repeats
    if repeats == 1 and value not in (0, 1):
        raise RunError(key, f"{where}: {metric}: expected 0 or 1 (a binary metric), got {value!r}")
    if not 0 <= right <= repeats or abs(right - round(right)) > 1e-6:
        raise RunError(key, f"{where}: {metric}: expected the fraction of {repeats} repeats that were right "
                            f"(0, 1/{repeats}, ..., 1), got {value!r}")
    right = round(right)
    return reduce([True] * right + [False] * (repeats - right), args["reducer"], key, where, "repeats")


def _responses(resps: Any, where: str, key: str) -> list[str]:
    """The raw responses of a doc's request: ``resps`` is one list per request of its repeats."""
    if not isinstance(resps, list) or not resps or not isinstance(resps[0], list):
        raise RunError(key, f"{where}: resps: expected lm-eval's list of responses per request, got {short(repr(resps))}")
    return [t if isinstance(t, str) else json.dumps(t) for t in resps[0]]


def _prompt_text(arguments: Any) -> str:
    """The prompt as lm-eval sent it: the first request's first argument (its context)."""
    if isinstance(arguments, dict) and arguments:
        first = next(iter(arguments.values()))
        if isinstance(first, dict) and first:
            return str(next(iter(first.values())))
    return ""
