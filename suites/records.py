"""Benchmark records: reading them from a file, and choosing a reproducible subset of prompts.

A data file is JSON Lines (``.jsonl``), gzipped JSON Lines (``.jsonl.gz``) or one JSON array
(``.json``, as MBPP's sanitized file). The suites read their vendored copies in
``suites/data/`` by default; ``path`` in ``suite_args`` points a suite at a file of your own
with the same fields. Errors name the file, the line or record, the key and what was expected.
"""
from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from pytest_redline.contracts import Prompt

DATA = Path(__file__).parent / "data"
_MISSING = object()


@dataclass(frozen=True)
class Record:
    """One record of a data file; ``where`` ("file:line") locates it in error messages."""

    where: str
    fields: Mapping[str, Any]

    def get(self, key: str, kind: type | tuple[type, ...] = str, default: Any = _MISSING) -> Any:
        """``fields[key]``, checked to be of ``kind``; a missing or ill-typed value is a ValueError."""
        if key not in self.fields:
            if default is not _MISSING:
                return default
            raise ValueError(f"{self.where}: missing key {key!r} (fields found: {sorted(self.fields)})")
        value = self.fields[key]
        if isinstance(value, bool) or not isinstance(value, kind):
            names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            raise ValueError(f"{self.where}: key {key!r}: expected {names}, got {value!r:.80}")
        return value

    def strings(self, key: str, default: Any = _MISSING) -> list[str]:
        """``fields[key]`` checked to be a list of strings."""
        value = self.get(key, list, default)
        if not all(isinstance(item, str) for item in value):
            raise ValueError(f"{self.where}: key {key!r}: expected a list of strings, got {value!r:.80}")
        return value


def read_records(path: str | Path) -> list[Record]:
    """Every record of a ``.jsonl``, ``.jsonl.gz`` or ``.json`` (array) file, in file order."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such data file")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: cannot be read as UTF-8 text ({error})") from None
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not valid JSON ({error})") from None
        located = [(f"{path}: record {i}", item) for i, item in enumerate(items)]
    else:
        located = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                located.append((f"{path}:{number}", json.loads(line)))
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not valid JSON ({error.msg})") from None
    for where, item in located:
        if not isinstance(item, dict):
            raise ValueError(f"{where}: expected a JSON object, got {item!r:.80}")
    return [Record(where, item) for where, item in located]


def data_path(path: str | Path | None, default: str) -> Path:
    """The user's file if given, else the vendored ``suites/data/<default>``."""
    return Path(path) if path is not None else DATA / default


def check_int(value: Any, key: str, suite: str, low: int, high: int | None = None) -> int:
    """``value`` as an int in ``[low, high]``, else a ValueError naming ``suite_args.<key>``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        expected = f"an int in {low}..{high}" if high is not None else f"an int >= {low}"
        raise ValueError(f"suite {suite!r}: suite_args.{key}: expected {expected}, got {value!r}")
    return value


def reject_unknown(suite: str, unknown: Mapping[str, Any], allowed: Sequence[str]) -> None:
    if unknown:
        raise ValueError(f"suite {suite!r}: unknown suite_args key(s) {sorted(unknown)}; expected some of {sorted(allowed)}")


def select(prompts: Sequence[Prompt], suite: str, seed: int | None = None, count: int | None = None,
           ids: Sequence[str | int] | None = None) -> list[Prompt]:
    """A reproducible subset of ``prompts``.

    - ``count`` (with ``seed``, default 0): ``random.Random(seed).sample`` of that many prompts,
      kept in file order;
    - ``ids``: exactly those prompts, in the order given; an entry is a full id
      (``"gsm8k/17"``) or the part after the suite's prefix (``17`` or ``"17"``);
    - neither: every prompt.
    """
    if ids is not None and (count is not None or seed is not None):
        raise ValueError(f"suite {suite!r}: suite_args.ids cannot be combined with count or seed")
    if ids is not None:
        return _by_ids(prompts, suite, ids)
    if count is None:
        if seed is not None:
            raise ValueError(f"suite {suite!r}: suite_args.seed needs suite_args.count (how many prompts to draw)")
        return list(prompts)
    check_int(count, "count", suite, 1, len(prompts))
    seed = check_int(seed if seed is not None else 0, "seed", suite, 0)
    chosen = sorted(random.Random(seed).sample(range(len(prompts)), count))
    return [prompts[i] for i in chosen]


def _by_ids(prompts: Sequence[Prompt], suite: str, ids: Sequence[str | int]) -> list[Prompt]:
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence) or not ids:
        raise ValueError(f"suite {suite!r}: suite_args.ids: expected a non-empty list of prompt ids, got {ids!r:.80}")
    by_id = {p.id: p for p in prompts}
    chosen: list[Prompt] = []
    seen: set[str] = set()
    for entry in ids:
        key = str(entry)
        if key not in by_id:
            key = f"{suite}/{key}"
        if key not in by_id:
            example = next(iter(by_id), "none")
            raise ValueError(f"suite {suite!r}: suite_args.ids: unknown prompt id {entry!r} (ids look like {example!r})")
        if key in seen:
            raise ValueError(f"suite {suite!r}: suite_args.ids: {entry!r} is listed twice")
        seen.add(key)
        chosen.append(by_id[key])
    return chosen
