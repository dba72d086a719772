"""One grid, prepared for a session: its prompts, configs, engines and test level.

:func:`prepare` finishes what the grid file alone cannot check, still before any model
loads: that the engine and suite names are registered, that input paths exist, that the
suite has prompts, that ``reference`` and ``deploy`` name configs, that each config's
parameters pass its engine's model-free ``check_config(params)`` (a classmethod of the
class the registry returns; engines without one are not checked), and that n is large
enough for some config to pass at this alpha, delta and m. Every problem is a :class:`~pytest_redline.grid.GridError`.

A grid without a suite takes its prompts and default configs from its engine (``replay``:
the engine records them). That engine is built here; it loads no model.
"""
from __future__ import annotations

import difflib
import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from pytest_redline import contracts, registry, runs
from pytest_redline.contracts import ConfigError, EngineFactory, Prompt, Suite
from pytest_redline.decode.enginebook import EngineBook
from pytest_redline.grid import FASTEST, Grid

Mode = Literal["all", "select", "gate"]  # what a grid's deploy key asks (docs/contributing/architecture.md, Glossary)
MODES: dict[str | None, Mode] = {None: "all", FASTEST: "select"}  # any other deploy value names a config: "gate"
GRID_FILE, OPTION = "grid file", "--redline-alpha"  # where a grid's alpha came from (Calibration.alpha_source)


@dataclass(frozen=True)
class Calibration:
    """A grid in a session. ``configs`` are in grid order; ``delta_share`` is its test level."""

    grid: Grid
    label: str
    configs: tuple[str, ...]
    params: Mapping[str, Mapping[str, Any]]
    engines: Mapping[str, tuple[str, Mapping[str, Any]]]
    suite: Suite | None
    prompts: tuple[Prompt, ...]
    alpha: float
    delta: float
    delta_share: float
    grids_in_session: int
    correction: str
    deploy: str | None
    seed: int = 0  # orders the candidates' prompts (pytest_redline.schedule)
    full: bool = False  # --redline-full: every config on every prompt, no schedule
    cost_estimated: bool = False  # the cost is a wall time an engine measures (its ``wall_time_costs``)
    declared: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # per config: what its checkpoint declares
    alpha_source: str = OPTION  # GRID_FILE (the grid's `alpha:`) or OPTION (--redline-alpha)
    reads_every_outcome: bool = False  # every config's engine declares read_every_outcome: no schedule (full)

    @property
    def advisory(self) -> bool:
        """``required: false``: gated, reported and counted in the delta split; it fails nothing."""
        return self.grid.advisory

    @property
    def reference(self) -> str:
        return self.grid.reference

    @property
    def mode(self) -> Mode:
        """``all`` (no deploy), ``select`` (deploy: fastest) or ``gate`` (deploy: NAME)."""
        return MODES.get(self.deploy, "gate")

    @property
    def replayed(self) -> bool:
        """Recorded outcomes (no suite): every outcome exists already, at no cost."""
        return self.suite is None

    @property
    def n(self) -> int:
        return len(self.prompts)

    @property
    def m(self) -> int:
        return len(self.configs)

    def stop_rule(self):
        """When a candidate's certification is decided (:class:`~pytest_redline.schedule.StopRule`)."""
        from pytest_redline.schedule import StopRule

        return StopRule.of(self.n, self.alpha, self.delta_share, self.m, self.correction)

    def collection_order(self) -> tuple[str, ...]:
        """The reference first (candidates need its outcomes), then the grid's order."""
        return (self.reference,) + tuple(c for c in self.configs if c != self.reference)


@dataclass(frozen=True)
class Level:
    """The session's test settings for one grid."""

    alpha: float
    delta: float
    grids_in_session: int
    correction: str
    deploy_override: str | None
    seed: int = 0
    full: bool = False


def prepare(grid: Grid, label: str, level: Level, engines: EngineBook) -> Calibration:
    for key, name in _engine_names(grid):
        _registered(grid, key, registry.ENGINES, name)
    grid.check_paths()
    if grid.suite is not None:
        _registered(grid, "suite", registry.SUITES, grid.suite)
        suite = _build_suite(grid)
        prompts, recorded = tuple(suite.prompts()), None
        if not prompts:
            raise grid.error("suite", f"expected a suite with prompts; suite {grid.suite!r} with suite_args {dict(grid.suite_args)!r} has none")
    else:
        suite = None
        prompts, recorded = (None, None) if runs.over_runs(grid) else _recorded(grid, engines)
    configs, params, engine_of = _configs(grid, recorded)
    classes = {name: _engine_class(grid, engine) for name, (engine, _) in engine_of.items()}
    _check_configs(grid, params, classes)
    prompts, params = runs.check_runs(grid, classes, engine_of, params, prompts)  # recorded runs (lm_eval, inspect)
    declared = _check_engine_args(grid, engine_of, classes, params)
    _check_prompts(grid, prompts)
    deploy = _deploy(grid, configs, level.deploy_override)
    delta = level.delta if level.delta is not None else (grid.delta if grid.delta is not None else 0.10)
    read_all = all(contracts.reads_every_outcome(c) for c in classes.values())
    cal = Calibration(
        grid=grid, label=label, configs=configs, params=params, engines=engine_of, suite=suite,
        prompts=prompts, alpha=grid.alpha if grid.alpha is not None else level.alpha, delta=delta,
        delta_share=delta / level.grids_in_session,
        grids_in_session=level.grids_in_session, correction=level.correction, deploy=deploy,
        seed=level.seed, full=level.full or read_all,
        cost_estimated=any(grid.cost in getattr(c, "wall_time_costs", ()) for c in classes.values()),
        declared=declared, alpha_source=GRID_FILE if grid.alpha is not None else OPTION, reads_every_outcome=read_all,
    )
    _check_n(cal)
    return cal


def _engine_names(grid: Grid):
    if grid.engine is not None:
        yield "engine", grid.engine
    for spec in grid.configs or ():
        if spec.engine is not None:
            yield f"configs.{spec.name}.engine", spec.engine


def _registered(grid: Grid, key: str, group: str, name: str) -> None:
    try:
        registry.check(group, name)
    except registry.RegistryError as e:
        raise grid.error(key, str(e)) from None


def _build_suite(grid: Grid) -> Suite:
    try:
        return registry.factory(registry.SUITES, grid.suite)(**grid.suite_args)
    except Exception as e:
        raise grid.error("suite_args", f"suite {grid.suite!r} failed to build with {dict(grid.suite_args)!r}: {type(e).__name__}: {e}") from None


def _recorded(grid: Grid, engines: EngineBook) -> tuple[tuple[Prompt, ...], Mapping[str, Mapping[str, Any]]]:
    """Prompts and configs from an engine that records them (replay)."""
    try:
        engine = engines.get(grid.engine, grid.engine_args)
    except Exception as e:
        raise grid.error("engine_args", str(e)) from None
    if not (hasattr(engine, "prompts") and hasattr(engine, "configs")):
        raise grid.error("suite", f"expected a suite: engine {grid.engine!r} does not record its own prompts")
    prompts = tuple(engine.prompts())
    if not prompts:
        raise grid.error("engine_args", f"expected recorded prompts; engine {grid.engine!r} has none")
    return prompts, dict(engine.configs())


def _configs(grid: Grid, recorded: Mapping[str, Mapping[str, Any]] | None):
    if grid.configs is None:
        if recorded is None:
            raise grid.error("configs", "expected a mapping of config name -> engine parameters")
        names = tuple(recorded)
        params = {name: dict(recorded[name]) for name in names}
        engine_of = {name: (grid.engine, dict(grid.engine_args)) for name in names}
    else:
        names = tuple(spec.name for spec in grid.configs)
        params, engine_of = {}, {}
        for i, spec in enumerate(grid.configs):
            if spec.params is None or (not spec.params and recorded and spec.name in recorded):
                # a name in a list, or `name: {}` in a mapping: its recorded parameters
                if recorded is None or spec.name not in recorded:
                    known = ", ".join(recorded) if recorded else "none: a suite grid needs configs as a mapping"
                    raise grid.error(f"configs[{i}]", f"expected a recorded config ({known}), got {spec.name!r}")
                params[spec.name] = dict(recorded[spec.name])
            else:
                params[spec.name] = dict(spec.params)
            engine = spec.engine or grid.engine
            engine_of[spec.name] = (engine, dict(spec.engine_args) if spec.engine else {**grid.engine_args, **spec.engine_args})
    for name in names:
        if "::" in name:
            raise grid.error(f"configs.{name}", "expected a config name without '::' (it separates node ids)")
    grid.check_names(names)
    return names, params, engine_of


def _engine_class(grid: Grid, name: str) -> EngineFactory:
    try:
        return registry.factory(registry.ENGINES, name)
    except registry.RegistryError as e:
        raise grid.error("engine", str(e)) from None


def _check_configs(grid: Grid, params: Mapping[str, Mapping[str, Any]], classes: Mapping[str, EngineFactory]) -> None:
    """Each config's parameters through its engine's ``check_config`` (no model loads): a
    typo is one usage error now, not an error on every item after the reference decoded.
    A :class:`~pytest_redline.contracts.ConfigError` names the key (and the keys the engine
    knows); any other error names the config."""
    for name, values in params.items():
        check = getattr(classes[name], "check_config", None)
        if not callable(check):
            continue
        try:
            check(dict(values))
        except ConfigError as e:
            where = f"configs.{name}" + (f".{e.key}" if e.key is not None else "")
            raise grid.error(where, str(e) + _did_you_mean(e.key, e.known)) from None
        except (ValueError, TypeError, KeyError) as e:
            message = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
            raise grid.error(f"configs.{name}", message) from None


def _check_engine_args(grid: Grid, engine_of, classes: Mapping[str, EngineFactory], params) -> dict[str, dict[str, Any]]:
    """Each engine's model-free ``check_engine_args`` (a checkpoint's family, declared block size
    and mask token): a bad checkpoint is a usage error before any model loads. A check that takes
    a config's parameters is called for each config, another once per distinct engine and
    arguments. Returns, per config, the mapping the check reports (the values the engine will
    use), for the JSON report: copied, not read."""
    reported: dict[str, dict[str, Any]] = {}
    checked: dict[tuple[str, str, str], Any] = {}
    for name, (engine, args) in engine_of.items():
        check = getattr(classes[name], "check_engine_args", None)
        if not callable(check):
            continue
        per_config = _takes_params(check)
        key = (engine, repr(sorted(args.items(), key=str)), repr(sorted(params[name].items(), key=str)) if per_config else "")
        if key not in checked:
            try:
                checked[key] = check(dict(args), dict(params[name])) if per_config else check(dict(args))
            except (ValueError, TypeError, OSError) as e:
                own = any(spec.name == name and spec.engine_args for spec in grid.configs or ())
                raise grid.error(f"configs.{name}.engine_args" if own else "engine_args", str(e)) from None
        if checked[key]:
            reported[name] = dict(checked[key])
    return reported


def _takes_params(check: Any) -> bool:
    """Whether ``check_engine_args`` takes a config's parameters after the engine arguments."""
    try:
        parameters = list(inspect.signature(check).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in parameters)


def _did_you_mean(key: str | None, known: tuple[str, ...]) -> str:
    """A "did you mean" for a key the engine does not know, from the keys it does."""
    if key is None or not known or key in known:
        return ""
    close = difflib.get_close_matches(str(key), known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _prompts_key(grid: Grid) -> str:
    """The grid key that the prompts come from, for a message about them: the suite, else the
    reference's recorded run (lm_eval, inspect), else the recording engine's arguments (replay)."""
    if grid.suite is not None:
        return "suite"
    if runs.over_runs(grid):
        return f"configs.{grid.reference}.path"
    return "engine_args"


def _check_prompts(grid: Grid, prompts: tuple[Prompt, ...]) -> None:
    key = _prompts_key(grid)
    seen = set()
    for prompt in prompts:
        if prompt.id in seen:
            raise grid.error(key, f"expected distinct prompt ids, got {prompt.id!r} twice")
        if "::" in prompt.id:
            raise grid.error(key, f"expected prompt ids without '::' (it separates node ids), got {prompt.id!r}")
        seen.add(prompt.id)
    from pytest_redline.slices import check_prompts

    unsliced = check_prompts(prompts, grid.slice_by)
    if unsliced:
        raise grid.error("slice_by", unsliced)


def _deploy(grid: Grid, configs: tuple[str, ...], override: str | None) -> str | None:
    if override is None:
        return grid.deploy
    if override != FASTEST and override not in configs:
        raise grid.error("deploy", f"--redline-deploy: expected {FASTEST!r} or one of the configs ({', '.join(configs)}), got {override!r}")
    return override


def _check_n(cal: Calibration) -> None:
    """Refuse an n at which no config could ever pass (even with no violation at all)."""
    from pytest_redline.risk import critical_count

    level = cal.delta_share / cal.m
    if critical_count(cal.n, cal.alpha, level) >= 0:
        return
    n = math.ceil(math.log(level) / math.log1p(-cal.alpha))
    while critical_count(n, cal.alpha, level) < 0:
        n += 1
    while n > 1 and critical_count(n - 1, cal.alpha, level) >= 0:
        n -= 1
    raise cal.grid.error(
        _prompts_key(cal.grid),
        f"expected at least {n} prompts: with n={cal.n} no config can pass at alpha={cal.alpha:g} ({cal.alpha_source}), "
        f"delta={cal.delta_share:g} and m={cal.m} configs (critical count < 0 even for 0 violations)",
    )
