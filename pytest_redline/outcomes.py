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
from typing import Any, Callable, Iterable, Mapping, Sequence

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


@dataclass(frozen=True, eq=False)
class OutcomeTable:
    """Per-prompt outcomes of m configs on the same n prompts.

    :ivar configs: names in file order (the order breaks ties in selection).
    :ivar prompts: prompt ids, in the first config's order.
    :ivar correct: a bool array (m, n).
    :ivar tokens: a float array (m, n), NaN where the cell was empty (``forwards`` likewise).
    :ivar extra: extra cost columns by name, float arrays (m, n), NaN where empty.
    :ivar source: where the table came from, for error messages.
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
        if not any(any(cell.strip() for cell in line) for line in lines):
            raise OutcomeError(f"{source}: empty file, expected the header {','.join(BASE_COLUMNS)}")
        header = [cell.strip() for cell in lines[0]]
        extra_names = _check_header(header, source)
        numbers, body = [], []
        for number, cells in enumerate(lines[1:], start=2):
            if len(cells) != len(header):
                if not any(cell.strip() for cell in cells):
                    continue  # a blank line
                raise OutcomeError(f"{source}: line {number}: expected {len(header)} fields, got {len(cells)}")
            numbers.append(number)
            body.append(cells)
        columns = dict(zip(header, map(list, zip(*body)))) if body else {name: [] for name in header}
        return _build(columns, extra_names, source, lambda i: f"{source}: line {numbers[i]}")

    @classmethod
    def from_records(cls, records: Iterable[Mapping[str, Any]], source: str = "<records>") -> "OutcomeTable":
        """Build from mappings with the CSV's keys (extra keys are cost columns; None is empty)."""
        records = list(records)
        extra_names = tuple(k for k in records[0] if k not in BASE_COLUMNS) if records else ()
        _check_header(list(BASE_COLUMNS) + list(extra_names), source)
        for number, record in enumerate(records, start=1):
            names = tuple(k for k in record if k not in BASE_COLUMNS)
            if set(names) != set(extra_names):
                raise OutcomeError(f"{source}: record {number}: expected extra columns {list(extra_names)}, got {list(names)}")
            for key in ("config", "prompt", "correct"):
                if key not in record:
                    raise OutcomeError(f"{source}: record {number}: missing column '{key}'")
        columns = {name: [r.get(name) for r in records] for name in BASE_COLUMNS + extra_names}
        return _build(columns, extra_names, source, lambda i: f"{source}: record {i + 1}")

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

    def select(self, which: Sequence[str] | np.ndarray) -> "OutcomeTable":
        """The table restricted to the configs ``which`` names, in that order; or, when
        ``which`` is a boolean (configs x prompts) mask such as the prompts each config ran
        on, the cells it marks: the others read wrong, with empty (NaN) costs."""
        if isinstance(which, np.ndarray) and which.dtype == bool:
            keep = self._mask(which)
            nan = np.where(keep, 0.0, np.nan)  # adding it empties the cells outside the mask
            return OutcomeTable(
                self.configs, self.prompts, self.correct & keep, self.tokens + nan, self.forwards + nan,
                {name: col + nan for name, col in self.extra.items()}, self.source,
            )
        configs = which
        if len(set(configs)) != len(configs) or not configs:
            raise OutcomeError(f"{self.source}: configs to select must be distinct and non-empty, got {list(configs)}")
        return self._take([self.index(name) for name in configs], slice(None))

    def cost_on(self, ran: np.ndarray, kind: str) -> np.ndarray:
        """Each config's cost (:meth:`cost`) over the prompts ``ran`` marks in its row, shape
        (m,); an OutcomeError when a config ran on no prompt."""
        keep = self._mask(ran)
        costs = []
        for i, config in enumerate(self.configs):
            cols = np.flatnonzero(keep[i])
            if cols.size == 0:
                raise OutcomeError(f"{self.source}: the cost of config '{config}' is unknown: it ran on no prompt")
            costs.append(self._take([i], cols).cost(kind)[0])
        return np.array(costs)

    def _mask(self, ran: np.ndarray) -> np.ndarray:
        keep = np.asarray(ran)
        if keep.dtype != bool or keep.shape != self.correct.shape:
            raise ValueError(f"{self.source}: expected a boolean mask of shape {self.correct.shape}, got {keep.dtype} {keep.shape}")
        return keep

    def _take(self, rows: Sequence[int], cols: Any) -> "OutcomeTable":
        """Rows ``rows`` and columns ``cols`` (indices, or a slice) of every array."""
        rows = np.asarray(rows)
        prompts = self.prompts[cols] if isinstance(cols, slice) else tuple(self.prompts[j] for j in cols)
        return OutcomeTable(
            configs=tuple(self.configs[i] for i in rows),
            prompts=prompts,
            correct=self.correct[rows][:, cols],
            tokens=self.tokens[rows][:, cols],
            forwards=self.forwards[rows][:, cols],
            extra={name: col[rows][:, cols] for name, col in self.extra.items()},
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


_FLAGS = {"0": False, "1": True, 0: False, 1: True}  # 1 == True: bools and ints map too


def _names(values: list[Any], column: str, where: Callable[[int], str]) -> list[str]:
    names = ["" if v is None else str(v).strip() for v in values]
    if not all(names):
        i = names.index("")
        raise OutcomeError(f"{where(i)}: column '{column}': expected a non-empty name, got '{values[i]}'")
    return names


def _flags(values: list[Any], where: Callable[[int], str]) -> np.ndarray:
    """The ``correct`` column: 0/1 (strings, ints or booleans)."""
    try:
        flags = [_FLAGS.get(v) for v in values]  # the common case, without a call per cell
    except TypeError:  # an unhashable value
        flags = [None]
    if None in flags:
        flags = [_flag(v) for v in values]  # strip blanks; report the first bad cell
        if None in flags:
            i = flags.index(None)
            raise OutcomeError(f"{where(i)}: column 'correct': expected 0 or 1, got '{values[i]}'")
    return np.array(flags, dtype=bool)


def _flag(value: Any) -> bool | None:
    if isinstance(value, str):
        return _FLAGS.get(value.strip())
    if isinstance(value, (int, bool, np.integer, np.bool_)):
        return _FLAGS.get(value)
    return None


def _parse_column(values: list[Any], column: str, where: Callable[[int], str], nonnegative: bool) -> np.ndarray:
    """A numeric column: finite numbers (>= 0 where asked), NaN for empty cells (None or blank)."""
    empty = np.array([v is None or (isinstance(v, str) and not v.strip()) for v in values], dtype=bool)
    try:
        numbers = np.array([math.nan if e else v for v, e in zip(values, empty)], dtype=float)
    except (TypeError, ValueError):
        numbers = np.full(len(values), math.inf)  # unparsable somewhere: flagged below
    bad = ~empty & (~np.isfinite(numbers) | ((numbers < 0) if nonnegative else False))
    bad |= np.array([isinstance(v, (bool, np.bool_)) for v in values], dtype=bool)
    if np.any(bad):
        for i in np.flatnonzero(bad):  # the first cell that really is bad, with its message
            _parse_cell(where(i), column, values[i], nonnegative)
    return numbers


def _parse_cell(where: str, column: str, value: Any, nonnegative: bool) -> float:
    """One cell: a finite number (>= 0 where asked), NaN when empty; else an OutcomeError."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return math.nan
    try:
        x = float(value)
    except (TypeError, ValueError):
        x = math.nan
    if not math.isfinite(x) or isinstance(value, (bool, np.bool_)):
        raise OutcomeError(f"{where}: column '{column}': expected a finite number or an empty cell, got '{value}'")
    if nonnegative and x < 0:
        raise OutcomeError(f"{where}: column '{column}': expected a number >= 0, got '{value}'")
    return x


def _build(columns: Mapping[str, list[Any]], extra_names: Sequence[str], source: str, where: Callable[[int], str]) -> OutcomeTable:
    """Parse the columns and align the rows into (configs x prompts) arrays.

    ``where(i)`` names row i (a line of a file or a record) in error messages.
    """
    config = _names(columns["config"], "config", where)
    if not config:
        raise OutcomeError(f"{source}: no outcome rows")
    prompt = _names(columns["prompt"], "prompt", where)
    cells = {
        "correct": _flags(columns["correct"], where),
        "tokens": _parse_column(columns["tokens"], "tokens", where, nonnegative=True),
        "forwards": _parse_column(columns["forwards"], "forwards", where, nonnegative=True),
        **{name: _parse_column(columns[name], name, where, nonnegative=False) for name in extra_names},
    }
    configs = tuple(dict.fromkeys(config))
    prompts = tuple(dict.fromkeys(p for c, p in zip(config, prompt) if c == configs[0]))
    config_index = {c: i for i, c in enumerate(configs)}
    prompt_index = {p: j for j, p in enumerate(prompts)}
    m, n = len(configs), len(prompts)
    flat = np.array([config_index[c] * n + prompt_index.get(p, -n * m - 1) for c, p in zip(config, prompt)])
    counts = np.bincount(flat[flat >= 0], minlength=m * n)
    if np.any(flat < 0) or np.any(counts > 1) or np.any(counts == 0):
        _alignment_error(config, prompt, configs, prompts, source, where)
    shaped = {}
    for name, values in cells.items():
        grid = np.empty(m * n, dtype=values.dtype)
        grid[flat] = values
        shaped[name] = grid.reshape(m, n)
    return OutcomeTable(
        configs=configs,
        prompts=prompts,
        correct=shaped["correct"],
        tokens=shaped["tokens"],
        forwards=shaped["forwards"],
        extra={name: shaped[name] for name in extra_names},
        source=source,
    )


def _alignment_error(config, prompt, configs, prompts, source, where) -> None:
    """Raise the first alignment problem in row order: a duplicate row or a different prompt set."""
    first_row: dict[tuple[str, str], int] = {}
    for i, key in enumerate(zip(config, prompt)):
        if key in first_row:
            raise OutcomeError(
                f"{where(i)}: duplicate row for config '{key[0]}', prompt '{key[1]}' "
                f"(first at {where(first_row[key]).rsplit(': ', 1)[-1]})"
            )
        first_row[key] = i
    expected = set(prompts)
    for c in configs:
        seen = {p for (cc, p) in first_row if cc == c}
        missing, extra = sorted(expected - seen), sorted(seen - expected)
        if missing or extra:
            parts = [f"{label} {len(ids)} prompt(s), e.g. '{ids[0]}'" for label, ids in (("lacks", missing), ("adds", extra)) if ids]
            raise OutcomeError(
                f"{source}: config '{c}' has a different prompt set from config '{configs[0]}': it " + " and ".join(parts)
            )


def _format_number(x: float) -> str:
    if math.isnan(x):
        return ""
    if x == int(x) and abs(x) < 2**53:
        return str(int(x))
    return repr(float(x))
