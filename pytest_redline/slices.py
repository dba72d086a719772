"""Slices: each config's regressions, V and accuracy broken down by a property of the prompts.

A grid names its slicings with ``slice_by:`` (one name or a list): ``prefix`` is the prompt id up
to its first ``/`` (``gsm8k/12`` -> ``gsm8k``; an lm-eval or Inspect grid's task), any other name
a field of the prompts' metadata (the MATH suite's ``subject`` and ``level``, a named Inspect
metadata field). Without ``slice_by:`` the built-ins :data:`BUILT_IN` that split the prompts into
two or more slices are used; ``slice_by: []`` turns slicing off.

Slice figures are descriptive counts, not certificates: the certificate is the grid's. They are
counted on the prompts each config decoded, so for a config a scheduled run stopped early they are
the counts on its decoded prompts (the grid's V is then a bound, which does not split). A
certificate per slice is one grid per slice (docs/reference/grid-file.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from pytest_redline.contracts import Prompt

PREFIX = "prefix"
BUILT_IN = (PREFIX, "subject", "level")


@dataclass(frozen=True)
class SliceRow:
    """One config on one slice: ``prompts`` in the slice, ``decoded`` of them this config has an
    outcome for, ``violations`` (the reference right, this config wrong) and ``correct`` among the
    decoded ones. ``complete``: decoded on every prompt of the slice."""

    config: str
    slice: str
    prompts: int
    decoded: int
    violations: int
    correct: int

    @property
    def complete(self) -> bool:
        return self.decoded == self.prompts

    @property
    def accuracy(self) -> float:
        return self.correct / self.decoded if self.decoded else float("nan")

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config, "slice": self.slice, "prompts": self.prompts, "decoded": self.decoded,
                "violations": self.violations, "correct": self.correct,
                "accuracy": round(self.accuracy, 6) if self.decoded else None}


@dataclass(frozen=True)
class Slicing:
    """The prompts split by one property (``by``): the slice names in first-seen order, and a
    row per config and slice, configs in grid order."""

    by: str
    names: tuple[str, ...]
    rows: tuple[SliceRow, ...]

    def of(self, config: str) -> tuple[SliceRow, ...]:
        return tuple(r for r in self.rows if r.config == config)

    def to_json(self) -> dict[str, Any]:
        return {"by": self.by, "slices": list(self.names), "rows": [r.to_json() for r in self.rows],
                "note": NOTE}


NOTE = ("descriptive counts on the prompts each config decoded (not certificates); a stopped config's slices "
        "count only its decoded prompts")


def slice_value(prompt: Prompt, by: str) -> str | None:
    """The prompt's slice under ``by`` (None: the prompt has no such property)."""
    if by == PREFIX:
        head, sep, _ = prompt.id.partition("/")
        return head if sep else None
    value = prompt.meta.get(by) if prompt.meta else None
    return None if value is None else str(value)


def check_slice_by(value: Any) -> tuple[str, ...] | None:
    """The grid's ``slice_by:`` as names (None: the built-ins); raises ValueError on anything else."""
    if value is None:
        return None
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) and n.strip() for n in names):
        raise ValueError(f"expected {PREFIX!r}, a prompt metadata field, or a list of them, got {value!r}")
    return tuple(names)


def check_prompts(prompts: Sequence[Prompt], slice_by: tuple[str, ...] | None) -> str | None:
    """A message when a named slicing misses some prompt (None: every prompt has a slice)."""
    for by in slice_by or ():
        missing = [p.id for p in prompts if slice_value(p, by) is None]
        if missing:
            what = "an id with a '/'" if by == PREFIX else f"the metadata field {by!r}"
            return f"expected every prompt to have {what}; {len(missing)} do not (first: {missing[0]!r})"
    return None


def chosen(prompts: Sequence[Prompt], slice_by: tuple[str, ...] | None) -> tuple[str, ...]:
    """The slicings a grid uses: those it names, else the built-ins that split every prompt into
    two or more slices."""
    if slice_by is not None:
        return slice_by
    out = []
    for by in BUILT_IN:
        values = [slice_value(p, by) for p in prompts]
        if None not in values and len(set(values)) > 1:
            out.append(by)
    return tuple(out)


def slicings(v: Any) -> tuple[Slicing, ...]:
    """The grid's slicings, on the outcomes of a verdict (a :class:`~pytest_redline.verdict.GridVerdict`,
    not imported: the grid module reads this one) that certified; empty otherwise."""
    import numpy as np

    if v.result is None:
        return ()
    cal, record = v.cal, v.record
    table = record.table(ran_only=True)
    ran = record.ran()
    if table is None:
        return ()
    correct = table.correct & ran
    ref = cal.configs.index(cal.reference)
    right = correct[ref]
    out = []
    for by in chosen(cal.prompts, getattr(cal.grid, "slice_by", None)):
        labels = [slice_value(p, by) for p in cal.prompts]
        names = tuple(dict.fromkeys(labels))
        rows = []
        for i, config in enumerate(cal.configs):
            for name in names:
                mask = np.array([label == name for label in labels])
                rows.append(SliceRow(config, name, int(mask.sum()), int((ran[i] & mask).sum()),
                                     int((right & ran[i] & ~correct[i] & mask).sum()), int((correct[i] & mask).sum())))
        out.append(Slicing(by, names, tuple(rows)))
    return tuple(out)
