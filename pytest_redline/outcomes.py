"""Recorded outcomes as a configs x prompts table, and its CSV form.

The CSV header is ``config,prompt,correct,tokens,forwards`` followed by optional numeric
cost columns (``memory_gb``, ``flops``, ...). There is one row per (config, prompt), and
every config has the same prompts; rows may come in any order and are aligned by prompt
id, in the order of the first config. ``tokens``, ``forwards`` and the extra columns may
be empty where the chosen cost does not need them (the paper's quantization file has no
forwards); a cost that needs an empty cell is an :class:`OutcomeError` naming the column.
"""
from __future__ import annotations

import csv
import math
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

__all__ = ["BASE_COLUMNS", "OutcomeError", "OutcomeTable", "cost_direction", "gain_kind"]

BASE_COLUMNS = ("config", "prompt", "correct", "tokens", "forwards")
BUILTIN_COSTS = ("tpf", "apf")


class OutcomeError(ValueError):
    """Bad outcome data; the message names the file, the line or record, and the column."""


def cost_direction(kind: str) -> str:
    """``"lower"`` for memory-like costs (``memory``, ``memory_gb``, ...), else ``"higher"``."""
    return "lower" if kind == "memory" or kind.startswith("memory_") else "higher"


def gain_kind(direction: str) -> str:
    """How gain is reported: a reduction ``"factor"`` when lower is better, else ``"percent"``."""
    return "factor" if direction == "lower" else "percent"


@dataclass(frozen=True)
class _Row:
    """One parsed outcome, with where it came from (for error messages)."""

    where: str
    config: str
    prompt: str
    correct: bool
    tokens: float
    forwards: float
    extra: tuple[float, ...]


@dataclass(frozen=True, eq=False)
class OutcomeTable:
    """Per-prompt outcomes of m configs on the same n prompts.

    Attributes
    ----------
    configs : names in file order (the order breaks ties in selection).
    prompts : prompt ids, in the first config's order.
    correct : bool array (m, n).
    tokens, forwards : float arrays (m, n), NaN where the cell was empty.
    extra : extra cost columns by name, float arrays (m, n), NaN where empty.
    source : where the table came from, for error messages.
    """

    configs: tuple[str, ...]
    prompts: tuple[str, ...]
    correct: np.ndarray
    tokens: np.ndarray
    forwards: np.ndarray
    extra: Mapping[str, np.ndarray] = field(default_factory=dict)
    source: str = "<table>"

    @property
    def m(self) -> int:
        return len(self.configs)

    @property
    def n(self) -> int:
        return len(self.prompts)

    # ------------------------------------------------------------------ reading and writing

    @classmethod
    def read_csv(cls, path: str | os.PathLike) -> "OutcomeTable":
        """Read an outcome CSV; every problem is an OutcomeError naming file, line and column."""
        source = os.fspath(path)
        try:
            with open(source, newline="", encoding="utf-8-sig") as f:
                lines = list(csv.reader(f))
        except FileNotFoundError:
            raise OutcomeError(f"{source}: no such file") from None
        except (OSError, UnicodeDecodeError, csv.Error) as e:
            raise OutcomeError(f"{source}: cannot read outcomes ({e})") from None
        if not lines or all(not any(cell.strip() for cell in line) for line in lines):
            raise OutcomeError(f"{source}: empty file, expected the header {','.join(BASE_COLUMNS)}")
        header = [cell.strip() for cell in lines[0]]
        extra_names = _check_header(header, source)
        rows = []
        for number, cells in enumerate(lines[1:], start=2):
            if not any(cell.strip() for cell in cells):
                continue  # blank line
            where = f"{source}: line {number}"
            if len(cells) != len(header):
                raise OutcomeError(f"{where}: expected {len(header)} fields, got {len(cells)}")
            rows.append(_parse_row(where, dict(zip(header, cells)), extra_names))
        return _build(rows, extra_names, source)

    @classmethod
    def from_records(cls, records: Iterable[Mapping[str, Any]], source: str = "<records>") -> "OutcomeTable":
        """Build from mappings with the CSV's keys (extra keys are cost columns; None is empty)."""
        rows: list[_Row] = []
        extra_names: tuple[str, ...] | None = None
        for number, record in enumerate(records, start=1):
            where = f"{source}: record {number}"
            names = tuple(k for k in record if k not in BASE_COLUMNS)
            if extra_names is None:
                extra_names = names
                _check_header(list(BASE_COLUMNS) + list(names), source)
            elif set(names) != set(extra_names):
                raise OutcomeError(f"{where}: expected extra columns {list(extra_names)}, got {list(names)}")
            for key in ("config", "prompt", "correct"):
                if key not in record:
                    raise OutcomeError(f"{where}: missing column '{key}'")
            rows.append(_parse_row(where, record, extra_names))
        return _build(rows, extra_names or (), source)

    def write_csv(self, path: str | os.PathLike) -> None:
        """Write the table as an outcome CSV (atomically: a temporary file, then a rename)."""
        target = os.fspath(path)
        folder = os.path.dirname(os.path.abspath(target))
        fd, tmp = tempfile.mkstemp(prefix=".outcomes-", suffix=".csv", dir=folder)
        try:
            with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
                writer = csv.writer(f, lineterminator="\n")
                writer.writerow(BASE_COLUMNS + tuple(self.extra))
                for i, config in enumerate(self.configs):
                    for j, prompt in enumerate(self.prompts):
                        numbers = [self.tokens[i, j], self.forwards[i, j]] + [col[i, j] for col in self.extra.values()]
                        writer.writerow([config, prompt, int(self.correct[i, j])] + [_format_number(x) for x in numbers])
            os.replace(tmp, target)
        except BaseException:
            os.unlink(tmp)
            raise

    # ------------------------------------------------------------------ views

    def index(self, name: str) -> int:
        """The row of config ``name``."""
        try:
            return self.configs.index(name)
        except ValueError:
            raise OutcomeError(f"{self.source}: no config '{name}'; configs: {', '.join(self.configs)}") from None

    def select(self, configs: Sequence[str]) -> "OutcomeTable":
        """The table restricted to ``configs``, in that order."""
        if len(set(configs)) != len(configs) or not configs:
            raise OutcomeError(f"{self.source}: configs to select must be distinct and non-empty, got {list(configs)}")
        rows = [self.index(name) for name in configs]
        return OutcomeTable(
            configs=tuple(configs),
            prompts=self.prompts,
            correct=self.correct[rows],
            tokens=self.tokens[rows],
            forwards=self.forwards[rows],
            extra={name: col[rows] for name, col in self.extra.items()},
            source=self.source,
        )

    def with_column(self, name: str, values: Mapping[str, float] | Sequence[float]) -> "OutcomeTable":
        """Add (or replace) an extra column holding one value per config on every prompt.

        ``values`` maps every config name to a number, or lists one number per config.
        This is how memory enters: ``table.with_column("memory_gb", {"bf16": 16.061, ...})``.
        """
        if name in BASE_COLUMNS or name in BUILTIN_COSTS or not name:
            raise OutcomeError(f"{self.source}: column name '{name}' is reserved or empty")
        if isinstance(values, Mapping):
            missing = [c for c in self.configs if c not in values]
            if missing:
                raise OutcomeError(f"{self.source}: column '{name}' has no value for config(s) {', '.join(missing)}")
            per_config = [values[c] for c in self.configs]
        else:
            per_config = list(values)
            if len(per_config) != self.m:
                raise OutcomeError(f"{self.source}: column '{name}' needs {self.m} values, got {len(per_config)}")
        column = np.repeat(np.asarray(per_config, dtype=float)[:, None], self.n, axis=1)
        return OutcomeTable(
            self.configs, self.prompts, self.correct, self.tokens, self.forwards, {**self.extra, name: column}, self.source
        )

    def cost(self, kind: str) -> np.ndarray:
        """Each config's cost, shape (m,).

        - ``tpf``: tokens per forward, pooled: sum of tokens / sum of forwards.
        - ``apf``: accepted tokens per (target) forward: mean of tokens / max(forwards, 1).
        - any extra column name: that column's mean over the config's prompts.
        """
        if kind == "tpf":
            tokens, forwards = self._full("tokens", kind), self._full("forwards", kind)
            total = forwards.sum(axis=1)
            if np.any(total == 0):
                config = self.configs[int(np.flatnonzero(total == 0)[0])]
                raise OutcomeError(f"{self.source}: cost 'tpf' needs forwards, which sum to 0 for config '{config}'")
            return tokens.sum(axis=1) / total
        if kind == "apf":
            tokens, forwards = self._full("tokens", kind), self._full("forwards", kind)
            return (tokens / np.maximum(forwards, 1.0)).mean(axis=1)
        if kind in self.extra:
            return self._full(kind, kind).mean(axis=1)
        choices = ", ".join(BUILTIN_COSTS + tuple(self.extra))
        raise OutcomeError(f"{self.source}: unknown cost '{kind}'; expected one of {choices}")

    def _full(self, column: str, kind: str) -> np.ndarray:
        values = {"tokens": self.tokens, "forwards": self.forwards}.get(column)
        values = self.extra[column] if values is None else values
        empty = np.argwhere(np.isnan(values))
        if empty.size:
            i, j = empty[0]
            raise OutcomeError(
                f"{self.source}: cost '{kind}' needs column '{column}', which is empty for config "
                f"'{self.configs[i]}', prompt '{self.prompts[j]}' ({len(empty)} empty cells)"
            )
        return values


# ---------------------------------------------------------------------- parsing helpers


def _check_header(header: list[str], source: str) -> tuple[str, ...]:
    """The extra column names, after checking the fixed part of the header."""
    if tuple(header[: len(BASE_COLUMNS)]) != BASE_COLUMNS:
        raise OutcomeError(
            f"{source}: line 1: expected a header starting {','.join(BASE_COLUMNS)}, got {','.join(header)}"
        )
    extra = tuple(header[len(BASE_COLUMNS):])
    for name in extra:
        if not name or name in BASE_COLUMNS or name in BUILTIN_COSTS or extra.count(name) > 1:
            raise OutcomeError(f"{source}: line 1: extra column name '{name}' is empty, reserved or repeated")
    return extra


def _parse_row(where: str, cells: Mapping[str, Any], extra_names: Sequence[str]) -> _Row:
    config, prompt = _text(where, "config", cells["config"]), _text(where, "prompt", cells["prompt"])
    return _Row(
        where=where,
        config=config,
        prompt=prompt,
        correct=_correct(where, cells["correct"]),
        tokens=_number(where, "tokens", cells.get("tokens"), nonnegative=True),
        forwards=_number(where, "forwards", cells.get("forwards"), nonnegative=True),
        extra=tuple(_number(where, name, cells[name], nonnegative=False) for name in extra_names),
    )


def _text(where: str, column: str, value: Any) -> str:
    text = "" if value is None else str(value).strip()
    if not text:
        raise OutcomeError(f"{where}: column '{column}': expected a non-empty name, got '{value}'")
    return text


def _correct(where: str, value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip() in ("0", "1"):
        return value.strip() == "1"
    raise OutcomeError(f"{where}: column 'correct': expected 0 or 1, got '{value}'")


def _number(where: str, column: str, value: Any, nonnegative: bool) -> float:
    """A finite number, NaN for an empty cell (None or blank)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return math.nan
    try:
        x = float(value)
    except (TypeError, ValueError):
        x = math.nan
    if not math.isfinite(x) or isinstance(value, bool):
        raise OutcomeError(f"{where}: column '{column}': expected a finite number or an empty cell, got '{value}'")
    if nonnegative and x < 0:
        raise OutcomeError(f"{where}: column '{column}': expected a number >= 0, got '{value}'")
    return x


def _build(rows: list[_Row], extra_names: Sequence[str], source: str) -> OutcomeTable:
    """Align rows into (configs x prompts) arrays, checking duplicates and prompt sets."""
    if not rows:
        raise OutcomeError(f"{source}: no outcome rows")
    by_config: dict[str, dict[str, _Row]] = {}
    for row in rows:
        seen = by_config.setdefault(row.config, {})
        if row.prompt in seen:
            raise OutcomeError(
                f"{row.where}: duplicate row for config '{row.config}', prompt '{row.prompt}' "
                f"(first at {seen[row.prompt].where.rsplit(': ', 1)[-1]})"
            )
        seen[row.prompt] = row
    configs = tuple(by_config)
    prompts = tuple(by_config[configs[0]])
    expected = set(prompts)
    for config, seen in by_config.items():
        if set(seen) != expected:
            missing = sorted(expected - set(seen))
            extra = sorted(set(seen) - expected)
            parts = [f"{label} {len(ids)} prompt(s), e.g. '{ids[0]}'" for label, ids in (("lacks", missing), ("adds", extra)) if ids]
            raise OutcomeError(
                f"{source}: config '{config}' has a different prompt set from config '{configs[0]}': it "
                + " and ".join(parts)
            )
    grid = [[by_config[c][p] for p in prompts] for c in configs]
    return OutcomeTable(
        configs=configs,
        prompts=prompts,
        correct=np.array([[r.correct for r in line] for line in grid], dtype=bool),
        tokens=np.array([[r.tokens for r in line] for line in grid], dtype=float),
        forwards=np.array([[r.forwards for r in line] for line in grid], dtype=float),
        extra={name: np.array([[r.extra[k] for r in line] for line in grid], dtype=float) for k, name in enumerate(extra_names)},
        source=source,
    )


def _format_number(x: float) -> str:
    if math.isnan(x):
        return ""
    if x == int(x) and abs(x) < 2**53:
        return str(int(x))
    return repr(float(x))
