"""What the engines over recorded evaluation runs share (``lm_eval``, ``inspect``).

A team's evaluation harness has already run every config and written per-prompt logs; these
engines gate those logs with no model in the loop. A config names its run and its cost:

    configs:
      bf16: {path: runs/bf16, tokens_per_s: 1850}     # a constant cost, named like the grid's cost
      fp8:  {path: runs/fp8,  tokens_per_s: 2710}

Every parameter but ``path`` is a cost: a number (the config's constant) or the name of a
numeric per-sample field of its log (one value per prompt).

The runs of a grid are read and checked together, model-free, while the gate prepares the grid
(:meth:`RecordedRuns.check_runs`): the units (documents, sample ids) must pair across configs
with the same prompt hashes, each unit's outcome must be binary (repeats and epochs reduced by
a declared reducer), and each config must have its cost. Any problem is a :class:`RunError`
naming the config's key, the file, the unit and what was expected: a usage error (exit 4)
before anything decodes. The engine then serves each prompt's recorded outcome (or, when it
re-scores, the raw text for the grid's suite to judge), with the config's costs in ``extra``.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from pytest_redline.contracts import ConfigError, Generation, Prompt

REDUCERS = ("all", "any", "mode")
DIGEST = "logs_sha256"  # added to each config's parameters by check_runs: its run's file hashes (in the outcome key)
DERIVED_COSTS = ("tpf", "apf")  # computed from tokens and forwards, which recorded runs do not have


class RunError(ValueError):
    """A recorded run that cannot be gated: ``key`` is the grid key (``configs.fp8.path``)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class Unit:
    """One prompt of a run (an lm-eval document, an Inspect sample id).

    ``hashes`` must agree across configs (what pairs the unit); ``correct`` is its judgement, its
    repeats or epochs reduced (None when re-scoring); ``record`` is the log's own record, for
    per-sample cost fields; ``doc`` is the evaluated document, for matching a suite's prompts;
    ``meta`` the log's plain metadata fields of the prompt (an Inspect sample's ``metadata``),
    which become the prompt's metadata.
    """

    key: str
    prompt: str
    hashes: Mapping[str, str]
    correct: bool | None
    text: str
    record: Mapping[str, Any] = field(default_factory=dict)
    doc: Mapping[str, Any] | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)  # the log's own per-prompt metadata (slice_by may name a field)


@dataclass(frozen=True)
class Run:
    """One config's run: where it came from (for messages), its units in log order, and the
    SHA-256 of its files."""

    source: str
    units: Mapping[str, Unit]
    digest: str


def digest(paths: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        h.update(hashlib.sha256(Path(path).read_bytes()).digest())
    return h.hexdigest()


def short(value: str) -> str:
    return value[:12] + "..." if len(value) > 15 else value


def reduce(outcomes: Sequence[bool], reducer: str | None, key: str, where: str, what: str) -> bool:
    """One unit's judgement from its repeats (``what``: "repeats", "epochs"): the single one, or
    the declared reducer's; a mode tie is a RunError, as is several without a reducer."""
    if len(outcomes) == 1:
        return outcomes[0]
    if reducer is None:
        raise RunError(key, f"{where}: {len(outcomes)} {what}; expected engine_args.reducer "
                         f"({', '.join(REDUCERS)}): {what} of one prompt are not independent prompts")
    if reducer == "all":
        return all(outcomes)
    if reducer == "any":
        return any(outcomes)
    right = sum(outcomes)
    if 2 * right == len(outcomes):
        raise RunError(key, f"{where}: reducer 'mode' is undefined on a tie ({right} of {len(outcomes)} {what} "
                         "correct); expected an odd number of them, or reducer all or any")
    return 2 * right > len(outcomes)


def check_reducer(engine: str, reducer: Any) -> None:
    if reducer is not None and reducer not in REDUCERS:
        raise ValueError(f"{engine}: engine_args.reducer: expected one of {', '.join(REDUCERS)}, got {reducer!r}")


def check_name(engine: str, key: str, value: Any, required: bool = True) -> None:
    if (value is not None or required) and (not isinstance(value, str) or not value.strip()):
        raise ValueError(f"{engine}: engine_args.{key}: expected a non-empty string, got {value!r}")


def unit_key(prompt_id: str, prefix: str) -> str:
    """The unit a prompt id names: after ``<task>/`` for the engine's own prompts (the whole id
    when ``prefix`` is "": several tasks' units are keyed ``<task>/<doc>``), else its last path
    segment (a suite's ``gsm8k/12`` or ``arithmetic/cal/12`` is document 12)."""
    return prompt_id[len(prefix):] if prompt_id.startswith(prefix) else prompt_id.rsplit("/", 1)[-1]


class RecordedRuns:
    """The engine over one kind of log; subclasses define :meth:`parse_args` and :meth:`read`,
    and :meth:`match` when a suite's prompts can be checked against their documents."""

    name = ""
    batch_invariant = True  # one recorded answer per prompt, whatever the batch
    what = "prompts"  # how the log names its units, for messages ("docs", "samples")
    read_every_outcome = True  # reading a logged outcome costs nothing: no schedule, every V exact (contracts.py)

    def __init__(self, **engine_args: Any) -> None:
        self.args = self.parse_args(engine_args)
        self._runs: dict[str, tuple[Run, str]] = {}

    # ------------------------------------------------------------------ subclass interface

    @classmethod
    def parse_args(cls, engine_args: Mapping[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def read(cls, path: str, args: Mapping[str, Any], key: str) -> tuple[Run, str]:
        """The run at ``path`` and its task name (RunError with ``key`` when it cannot be gated)."""
        raise NotImplementedError

    @classmethod
    def match(cls, prompt: Prompt, unit: Unit, source: str, args: Mapping[str, Any]) -> None:
        """Check that a suite's prompt is the unit's document (a RunError otherwise)."""

    # ------------------------------------------------------------------ model-free checks

    @classmethod
    def check_engine_args(cls, engine_args: Mapping[str, Any]) -> None:
        cls.parse_args(engine_args)

    @classmethod
    def check_config(cls, params: Mapping[str, Any]) -> None:
        """``path`` (a string) and costs: each a number or the name of a per-sample field."""
        if not isinstance(params.get("path"), str) or not params["path"]:
            raise ConfigError("path", f"{cls.name}: path: expected the path of the config's run, got {params.get('path')!r}")
        for key, value in params.items():
            if key == DIGEST:
                raise ConfigError(key, f"{cls.name}: {key}: reserved (the grid's check records the run's file hashes there)")
            if key == "path":
                continue
            number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not number and not (isinstance(value, str) and value.strip()):
                raise ConfigError(key, f"{cls.name}: {key}: expected a cost, a number or the name of a numeric "
                                       f"per-sample field of the log, got {value!r}")

    @classmethod
    def check_runs(cls, engine_args: Mapping[str, Any], configs: Mapping[str, Mapping[str, Any]], *,
                   reference: str, cost: str, prompts: Sequence[Prompt] | None = None) -> tuple[list[Prompt], dict[str, dict]]:
        """Read and check every config's run together: the prompts (the grid's suite's, checked
        against the documents, or the reference run's own) and each config's parameters as the
        engine will get them, with its run's file hashes as ``logs_sha256`` (in the outcome key)."""
        args = cls.parse_args(engine_args)
        if cost in DERIVED_COSTS:
            raise RunError("cost", f"cost {cost!r} is computed from tokens and forwards, which {cls.name} logs do not "
                                   "record; name the grid's cost after what you measured (tokens_per_s, latency_s, ...)")
        runs, task = {}, ""
        for name, params in configs.items():
            if cost not in params:
                raise RunError(f"configs.{name}", f"expected a parameter {cost!r} (the grid's cost): a number, or the "
                                                  "name of a numeric per-sample field of the log")
            runs[name], task = cls.read(str(params["path"]), args, f"configs.{name}.path")
        for name, run in runs.items():
            _check_costs(run, configs[name], f"configs.{name}", cls.what)
            if name != reference:
                _pair(runs[reference], run, f"configs.{name}.path", cls.what)
        if prompts is None:
            if args.get("rescore"):
                raise RunError("suite", f"{cls.name}: rescore: true needs the grid's suite, whose judge scores the texts")
            prompts = [Prompt(id=f"{task}/{u.key}" if task else u.key, text=u.prompt, meta={**u.meta, **u.hashes})
                       for u in runs[reference].units.values()]
        else:
            _match_suite(cls, prompts, runs[reference], f"{task}/" if task else "", args)
        return list(prompts), {name: {**configs[name], DIGEST: run.digest} for name, run in runs.items()}

    # ------------------------------------------------------------------ the engine

    @classmethod
    def identity(cls, engine_args: Mapping[str, Any]) -> dict[str, Any]:
        """The engine's identity without building it (a warm rerun builds none): the runs' own
        hashes are in each config's parameters."""
        cls.parse_args(engine_args)
        return {"fingerprint": f"{cls.name} logs (each config's file hashes are its {DIGEST})", "runtime": {}}

    def fingerprint(self) -> str:
        return self.identity(self.args)["fingerprint"]

    def generate(self, prompts: Sequence[Prompt], config: Mapping[str, Any]) -> list[Generation]:
        run, task = self._run(config)
        costs = {k: v for k, v in config.items() if k not in ("path", DIGEST)}
        out = []
        for prompt in prompts:
            unit = run.units.get(unit_key(prompt.id, f"{task}/" if task else ""))
            if unit is None:
                raise ValueError(f"{run.source}: no {self.what[:-1]} for prompt {prompt.id!r}")
            extra = {k: float(v) if not isinstance(v, str) else float(unit.record[v]) for k, v in costs.items()}
            out.append(Generation(text=unit.text, tokens=None, forwards=None, extra=extra, correct=unit.correct))
        return out

    def _run(self, config: Mapping[str, Any]) -> tuple[Run, str]:
        path = str(config["path"])
        if path not in self._runs:
            self._runs[path] = self.read(path, self.args, "path")
        run, task = self._runs[path]
        if config.get(DIGEST, run.digest) != run.digest:
            raise ValueError(f"{run.source}: the run's files changed since the grid was checked "
                             f"(sha256 {short(run.digest)}, checked {short(str(config[DIGEST]))})")
        return run, task


def _check_costs(run: Run, params: Mapping[str, Any], key: str, what: str) -> None:
    """A per-sample cost field must be a finite number on every unit."""
    for name, value in params.items():
        if name == "path" or not isinstance(value, str):
            continue
        for unit in run.units.values():
            x = unit.record.get(value)
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
                raise RunError(f"{key}.{name}", f"{run.source}: {what[:-1]} {unit.key}: cost {name!r}: expected a finite number in "
                                                f"the per-sample field {value!r}, got {x!r}")


def _pair(reference: Run, run: Run, key: str, what: str) -> None:
    """Every unit of ``run`` is the reference's unit of the same key, with the same hashes."""
    for unit in reference.units.values():
        other = run.units.get(unit.key)
        if other is None:
            raise RunError(key, f"{run.source}: no {what[:-1]} {unit.key}, which the reference's run "
                                f"({reference.source}) has; expected the same {what} in every config")
        for name, value in unit.hashes.items():
            if other.hashes.get(name) != value:
                raise RunError(key, f"{run.source}: {what[:-1]} {unit.key}: {name} {short(str(other.hashes.get(name)))} "
                                    f"differs from the reference's ({reference.source}: {short(value)}); expected the "
                                    "same prompts in every config")
    extra = [k for k in run.units if k not in reference.units]
    if extra:
        raise RunError(key, f"{run.source}: {what[:-1]} {extra[0]} is not in the reference's run ({reference.source}) "
                            f"({len(extra)} such); expected the same {what} in every config")


def _match_suite(cls: type, prompts: Sequence[Prompt], reference: Run, prefix: str, args: Mapping[str, Any]) -> None:
    """Each of the suite's prompts is one document of the (paired) runs, and each document one prompt."""
    seen = set()
    for prompt in prompts:
        key = unit_key(prompt.id, prefix)
        unit = reference.units.get(key)
        if unit is None:
            raise RunError("suite", f"{reference.source}: no {cls.what[:-1]} {key} for the suite's prompt {prompt.id!r}; "
                                    f"expected the suite's prompts to be the run's {cls.what} (restrict the suite with suite_args)")
        cls.match(prompt, unit, reference.source, args)
        seen.add(key)
    extra = [k for k in reference.units if k not in seen]
    if extra:
        raise RunError("suite", f"{reference.source}: {cls.what[:-1]} {extra[0]} matches none of the suite's prompts "
                                f"({len(extra)} such); expected the suite's prompts to be the run's {cls.what}")
