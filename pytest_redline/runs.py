"""Grids over recorded evaluation runs: one run per config, checked together before anything decodes.

An engine class with a model-free ``check_runs(engine_args, configs, reference=, cost=, prompts=)``
(``lm_eval``, ``inspect``) reads every config's run while the grid is prepared. It returns the
prompts (the grid's suite's, checked against the runs, or, without a suite, the reference run's
own) and the configs' parameters with what identifies each run (its files' SHA-256, as
``logs_sha256``), which so enters the outcome key: a changed log is a new outcome. Its errors
(``ValueError``, with the grid key in ``key``) are usage errors naming the file, the unit and
what was expected. Every config of such a grid uses the same engine and engine_args.
"""
from __future__ import annotations

from typing import Any, Mapping

from pytest_redline import registry
from pytest_redline.grid import Grid


def over_runs(grid: Grid) -> bool:
    """Whether the grid's engine reads recorded runs named by its configs (then it records no
    prompts of its own before its configs are known)."""
    engine = grid.engine or next((spec.engine for spec in grid.configs or () if spec.engine), None)
    if engine is None:
        return False
    try:
        return callable(getattr(registry.factory(registry.ENGINES, engine), "check_runs", None))
    except registry.RegistryError:
        return False


def check_runs(grid: Grid, classes: Mapping[str, Any], engine_of: Mapping[str, tuple[str, Mapping[str, Any]]],
               params: Mapping[str, Mapping[str, Any]], prompts: tuple | None):
    """The prompts and the configs' parameters (with what identifies their runs) of a grid over
    recorded runs; unchanged for any other grid."""
    if not any(callable(getattr(classes[name], "check_runs", None)) for name in params):
        return prompts, params
    engines = {(engine, repr(sorted(args.items(), key=str))) for engine, args in engine_of.values()}
    if len(engines) != 1:
        raise grid.error("configs", "expected one engine and the same engine_args for every config of a grid over "
                                    f"recorded runs, got {len(engines)}")
    first = next(iter(params))
    try:
        found, checked = classes[first].check_runs(
            dict(engine_of[first][1]), {name: dict(values) for name, values in params.items()},
            reference=grid.reference, cost=grid.cost, prompts=list(prompts) if prompts is not None else None)
    except (ValueError, TypeError, OSError) as e:
        raise grid.error(getattr(e, "key", "engine_args"), str(e)) from None
    return tuple(found), {name: dict(checked[name]) for name in params}
