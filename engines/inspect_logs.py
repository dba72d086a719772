"""The ``inspect`` engine: Inspect eval logs as recorded outcomes.

    engine: inspect
    engine_args: {scorer: match}
    cost: tokens_per_s
    reference: bf16
    configs:
      bf16: {path: logs/bf16, tokens_per_s: 1850}
      fp8:  {path: logs/fp8/2026-01-01T00-00-00_task_abc.eval, tokens_per_s: 2710}

A config's ``path`` is an eval log (``.eval`` or ``.json``) or a folder holding exactly one. The unit
is the sample id, paired across configs by its input and target. The named scorer's value must
be binary: ``C``/``I``, a boolean, or the number 0 or 1; ``P``, ``N``, other numbers and dicts are
refused. With epochs > 1 each id's epochs are reduced by the declared ``reducer`` (``all``,
``any``, ``mode``). A log whose status is not ``success``, a sample with an error, or a sample
without the named score is refused: a crashed run must not be gated as regressions. A per-sample
cost field names a numeric field of the sample (``total_time``, ``working_time``). Logs are read
with ``inspect_ai.log.read_eval_log`` (the ``inspect`` extra).
"""
from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any, Mapping

from pytest_redline.engines.recorded import RecordedRuns, Run, RunError, Unit, check_name, check_reducer, digest, reduce

LOG_SUFFIXES = (".eval", ".json")
BINARY = {"C": True, "I": False}


class InspectEngine(RecordedRuns):
    name = "inspect"
    what = "samples"

    @classmethod
    def parse_args(cls, engine_args: Mapping[str, Any]) -> dict[str, Any]:
        known = ("scorer", "reducer")
        unknown = sorted(set(engine_args) - set(known))
        if unknown:
            raise TypeError(f"inspect: unknown engine argument {unknown[0]!r}; known: {', '.join(known)}")
        args = {"reducer": None, **engine_args}
        check_name(cls.name, "scorer", args.get("scorer"))
        check_reducer(cls.name, args["reducer"])
        return args

    @classmethod
    def read(cls, path: str, args: Mapping[str, Any], key: str) -> tuple[Run, str]:
        file = _log_file(Path(path), key)
        try:
            stat = file.stat()
            log = _read_log(str(file), stat.st_mtime_ns, stat.st_size)
        except ImportError:
            raise RunError(key, f"{file}: reading Inspect logs needs inspect-ai (pip install pytest-redline[inspect])") from None
        except Exception as e:
            raise RunError(key, f"{file}: cannot read the Inspect log ({type(e).__name__}: {e})") from None
        if log.status != "success":
            raise RunError(key, f"{file}: status {log.status!r}; expected 'success' (a partial or failed run is not gated)")
        epochs: dict[str, list[bool]] = {}
        first: dict[str, Any] = {}
        for sample in log.samples or ():
            where = f"{file}: sample {sample.id} (epoch {sample.epoch})"
            if sample.error is not None:
                raise RunError(key, f"{where}: error {_message(sample.error)!r}; expected a sample that ran to its score")
            epochs.setdefault(str(sample.id), []).append(_binary(sample.scores or {}, args["scorer"], where, key))
            first.setdefault(str(sample.id), sample)
        if not first:
            raise RunError(key, f"{file}: no samples (was the eval run with log_samples off?)")
        units = {}
        for sid, sample in first.items():
            correct = reduce(epochs[sid], args["reducer"], key, f"{file}: sample {sid}", "epochs")
            record = _fields(sample)
            hashes = {"input": _sha(_plain(sample.input)), "target": _sha(_plain(sample.target))}
            text = sample.output.completion if sample.output is not None else ""
            meta = {k: v for k, v in (sample.metadata or {}).items() if isinstance(v, (str, int, float, bool))}
            units[sid] = Unit(sid, _text(sample.input), hashes, correct, text, record, meta=meta)
        return Run(str(path), units, digest([file])), str(log.eval.task)


@functools.lru_cache(maxsize=8)
def _read_log(file: str, mtime_ns: int, size: int) -> Any:
    """The parsed log, once per file version: the grid's check and the engine read the same log
    (parsing a log of a few hundred samples takes about a second)."""
    from inspect_ai.log import read_eval_log

    return read_eval_log(file)


def _log_file(path: Path, key: str) -> Path:
    if path.is_file():
        return path
    if not path.is_dir():
        raise RunError(key, f"{path}: expected an Inspect eval log or a folder holding one, which does not exist")
    found = sorted(p for p in path.rglob("*") if p.suffix in LOG_SUFFIXES and p.is_file())
    if len(found) != 1:
        names = ", ".join(str(p.relative_to(path)) for p in found) or "none"
        raise RunError(key, f"{path}: {len(found)} eval logs ({names}); expected one, or a path to the log itself")
    return found[0]


def _binary(scores: Mapping[str, Any], scorer: str, where: str, key: str) -> bool:
    if scorer not in scores:
        raise RunError(key, f"{where}: no score {scorer!r}; scores: {', '.join(scores) or 'none'} (a missing score "
                            "is not a wrong answer)")
    value = scores[scorer].value
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value in BINARY:
        return BINARY[value]
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    raise RunError(key, f"{where}: score {scorer!r}: expected a binary value (C or I, true or false, 0 or 1), "
                        f"got {value!r}")


def _fields(sample: Any) -> dict[str, Any]:
    """What a per-sample cost may name: the sample's numeric metadata, its times, and its tokens
    summed over models (``input_tokens``, ``output_tokens``, ``total_tokens``)."""
    fields = {k: v for k, v in (sample.metadata or {}).items() if isinstance(v, (int, float))}
    fields.update(total_time=sample.total_time, working_time=sample.working_time)
    for name in ("input_tokens", "output_tokens", "total_tokens"):
        fields[name] = sum(getattr(usage, name, 0) or 0 for usage in (sample.model_usage or {}).values())
    return fields


def _message(error: Any) -> str:
    return str(getattr(error, "message", error))


def _plain(value: Any) -> Any:
    """An input or target as plain JSON: chat messages by role and text (their ids differ per run)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return [[getattr(m, "role", None), getattr(m, "text", m)] if not isinstance(m, str) else m for m in value]
    return str(value)


def _sha(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, ensure_ascii=False).encode()).hexdigest()


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return "\n".join(str(getattr(m, "text", m)) for m in value)
