"""The grid file: YAML in, a validated :class:`Grid` out.

Every problem is a :class:`GridError` naming the file, the key path and what was expected,
so that a bad grid is a usage error before any model loads. Which engine or suite names
exist, and how many prompts a suite has, are checked later (``calibration.py``): this
module reads the file only.

Relative paths resolve against the grid file's folder. A string argument is a path when
its key is one of :data:`PATH_KEYS` or ends in ``_path``; this applies to the keys of
``engine_args`` and ``suite_args`` (the grid's and each config's). Where the same arguments
name a ``base_url`` (a served model, e.g. the ``openai`` engine), ``model`` is the served
model's name, not a path, unless a ``server:`` there starts the server with ``{model}``
(:mod:`pytest_redline.servers`): then it is the folder the server is given. Whether input paths
exist is checked when the grid is prepared for a session (:meth:`Grid.check_paths`).
"""
from __future__ import annotations

import difflib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from pytest_redline import servers
from pytest_redline.checks import in_open_unit

KEYS = (
    "name", "suite", "suite_args", "engine", "engine_args", "cost", "direction",
    "alpha", "required",
    "reference", "configs", "deploy", "delta", "batch_size", "timeout", "engine_stops",
    "min_gain", "max_servers", "slice_by",
)
CONFIG_ENGINE_KEYS = ("engine", "engine_args")
PATH_KEYS = frozenset({"model", "outcomes", "path", "data", "draft", "target", "trace"})
INPUT_PATH_KEYS = PATH_KEYS - {"trace"}  # must exist; `trace` and `*_path` may name files to write
BUILTIN_DIRECTIONS = {"tpf": "higher", "apf": "higher", "memory": "lower"}
DEFAULT_BATCH_SIZE = 16
FASTEST = "fastest"


class GridError(Exception):
    """A bad grid file: ``<file>: <key path>: <what was expected>``."""

    def __init__(self, path: str | os.PathLike, key: str, message: str) -> None:
        self.path, self.key, self.message = os.fspath(path), key, message
        super().__init__(f"{self.path}: {key}: {message}" if key else f"{self.path}: {message}")


@dataclass(frozen=True)
class ConfigSpec:
    """One config of a grid. ``params`` is None when the engine's recorded configs supply it."""

    name: str
    params: Mapping[str, Any] | None
    engine: str | None
    engine_args: Mapping[str, Any]


@dataclass(frozen=True)
class Grid:
    """A validated grid file. ``configs`` is None when every recorded config is meant (replay)."""

    path: Path
    name: str
    suite: str | None
    suite_args: Mapping[str, Any]
    engine: str | None
    engine_args: Mapping[str, Any]
    cost: str
    direction: str
    reference: str
    configs: tuple[ConfigSpec, ...] | None
    deploy: str | None
    delta: float | None
    batch_size: int
    timeout: float | None
    engine_stops: bool = True  # engines stop at the suite's stop strings (the scorer cuts there anyway)
    alpha: float | None = None  # this grid's budget; None: --redline-alpha's
    advisory: bool = False  # `required: false`: gated and reported, but nothing in it fails the session
    # select mode: the least gain over the reference a deployed candidate must have, in the
    # report's gain unit (percent; a reduction factor for lower-is-better costs); None: any gain
    min_gain: float | None = None
    max_servers: int = 1  # servers the gate runs at once (configs with a `server:`); 1: one after another
    slice_by: tuple[str, ...] | None = None  # how outputs split each config's figures (pytest_redline.slices)

    @property
    def lower_is_better(self) -> bool:
        return self.direction == "lower"

    def error(self, key: str, message: str) -> GridError:
        return GridError(self.path, key, message)

    def check_paths(self) -> None:
        """Input paths (keys in :data:`INPUT_PATH_KEYS`, resolved) must exist, so that a missing
        model or data file is one usage error before any engine is built."""
        sets = [("suite_args", self.suite_args), ("engine_args", self.engine_args)]
        sets += [(f"configs.{spec.name}.engine_args", spec.engine_args) for spec in self.configs or ()]
        for key, args in sets:
            if args.get("server") is not None:
                try:
                    servers.check_command(args["server"], f"{key}.server", args.get("model"))
                except servers.ServerSpecError as e:
                    raise self.error(e.key, e.message) from None
            for name, value in args.items():
                served = name == "model" and "base_url" in args  # a served model's name
                if name in INPUT_PATH_KEYS and not served and isinstance(value, str) and not os.path.exists(value):
                    raise self.error(
                        f"{key}.{name}",
                        f"expected an existing file or folder, got {value} (no such file or folder; "
                        "relative paths resolve against the grid file's folder)",
                    )

    def check_names(self, names: tuple[str, ...]) -> None:
        """Check ``reference`` and ``deploy`` against the config names (once they are known)."""
        if self.reference not in names:
            raise self.error("reference", f"expected one of the configs ({', '.join(names)}), got {self.reference!r}")
        if self.deploy not in (None, FASTEST) and self.deploy not in names:
            raise self.error(
                "deploy", f"expected {FASTEST!r} or one of the configs ({', '.join(names)}), got {self.deploy!r}"
            )


def load_grid(path: str | os.PathLike) -> Grid:
    """Read and validate a grid file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise GridError(path, "", "no such grid file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise GridError(path, "", f"cannot read the grid file ({e})") from None
    return parse_grid(text, path)


def parse_grid(text: str, path: Path) -> Grid:
    data = _load_yaml(text, path)
    if not isinstance(data, dict):
        raise GridError(path, "", f"expected a mapping of grid keys at the top level, got {_kind(data)}")
    for key in data:
        if key not in KEYS:
            raise GridError(path, str(key), f"unknown key{_suggest(str(key), KEYS)}")
    return _Reader(path, data).grid()


class _Reader:
    """Validates the keys of one parsed grid file."""

    def __init__(self, path: Path, data: dict) -> None:
        self.path, self.data, self.folder = path, data, path.resolve().parent

    def fail(self, key: str, message: str) -> GridError:
        return GridError(self.path, key, message)

    def grid(self) -> Grid:
        engine = self.optional_str("engine")
        configs = self.configs()
        if engine is None and (configs is None or any(c.engine is None for c in configs)):
            raise self.fail("engine", "expected an engine name (here, or an `engine:` in every config)")
        cost = self.optional_str("cost") or "tpf"
        reference = self.optional_str("reference")
        if reference is None:
            raise self.fail("reference", "expected the name of the reference config")
        grid = Grid(
            path=self.path,
            name=self.optional_str("name") or self.path.stem,
            suite=self.optional_str("suite"),
            suite_args=self.args("suite_args", self.data.get("suite_args")),
            engine=engine,
            engine_args=self.args("engine_args", self.data.get("engine_args")),
            cost=cost,
            direction=self.direction(cost),
            reference=reference,
            configs=configs,
            deploy=self.optional_str("deploy"),
            delta=self.probability("delta"),
            batch_size=self.batch_size(),
            timeout=self.timeout(),
            alpha=self.probability("alpha"),
            advisory=not self.flag("required", True),
            engine_stops=self.flag("engine_stops", True),
            min_gain=self.min_gain(cost),
            max_servers=self.positive_int("max_servers", 1),
            slice_by=self.slice_by(),
        )
        if configs is not None:
            grid.check_names(tuple(c.name for c in configs))
        self.check_servers(grid)
        return grid

    def check_servers(self, grid: Grid) -> None:
        """Each config's engine arguments (its own over the grid's, as calibration merges them)
        around a server: ``{port}`` in ``base_url``, a ``model`` for ``{model}``."""
        sets = [("engine_args", grid.engine_args)] if not grid.configs else []
        for spec in grid.configs or ():
            own = spec.engine is not None
            merged = dict(spec.engine_args) if own else {**grid.engine_args, **spec.engine_args}
            sets.append((f"configs.{spec.name}.engine_args" if own or spec.engine_args else "engine_args", merged))
        for key, args in sets:
            try:
                servers.check_engine_args(args, key)
            except servers.ServerSpecError as e:
                raise self.fail(e.key, e.message) from None

    def optional_str(self, key: str) -> str | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, f"expected a non-empty string, got {_show(value)}")
        return value.strip()

    def args(self, key: str, value: Any) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a mapping of arguments, got {_show(value)}")
        out = {}
        for name, arg in value.items():
            if not isinstance(name, str):
                raise self.fail(key, f"expected string argument names, got {_show(name)}")
            if name == "server" and key.endswith("engine_args"):
                out[name] = self.server(arg, f"{key}.server")
            else:
                out[name] = arg if name == "model" and "base_url" in value else self.resolve(name, arg)
        return self.server_model(out, out.get("server")) if key.endswith("engine_args") else out

    def server(self, value: Any, key: str) -> dict[str, Any]:
        try:
            return servers.parse_server(value, key, self.folder)
        except servers.ServerSpecError as e:
            raise self.fail(e.key, e.message) from None

    def server_model(self, args: dict, server: Mapping[str, Any] | None) -> dict:
        """A served ``model`` that a server is started with (``{model}``) is the folder given to
        it: resolved like any path, so that the server serves it under the name requests use."""
        if servers.uses_model(server) and isinstance(args.get("model"), str):
            args["model"] = self.resolve("model", args["model"])
        return args

    def resolve(self, name: str, value: Any) -> Any:
        if not isinstance(value, str) or not (name in PATH_KEYS or name.endswith("_path")):
            return value
        path = Path(value).expanduser()
        return os.path.normpath(path if path.is_absolute() else self.folder / path)

    def direction(self, cost: str) -> str:
        given = self.data.get("direction")
        builtin = BUILTIN_DIRECTIONS.get(cost)
        if given is None:
            return builtin or "higher"
        if given not in ("higher", "lower"):
            raise self.fail("direction", f"expected 'higher' or 'lower', got {_show(given)}")
        if builtin is not None and given != builtin:
            raise self.fail("direction", f"cost {cost!r} is {builtin}-is-better, got {given!r}")
        return given

    def probability(self, key: str) -> float | None:
        value = self.data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not in_open_unit(value):
            raise self.fail(key, f"expected a number in (0, 1), got {_show(value)}")
        return float(value)

    def min_gain(self, cost: str) -> float | None:
        """Percent of the reference's cost (>= 0); for a lower-is-better cost, whose gain is a
        reduction factor (memory: 2.0 means half the memory), a factor >= 1."""
        value = self.data.get("min_gain")
        if value is None:
            return None
        factor = self.direction(cost) == "lower"
        least = 1 if factor else 0
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not least <= value < math.inf:
            what = (f"a reduction factor >= 1 (cost {cost!r} is lower-is-better: 2 means half the reference's cost)"
                    if factor else f"a gain in percent of the reference's {cost} >= 0 (5 means +5 %)")
            raise self.fail("min_gain", f"expected {what}, got {_show(value)}")
        return float(value)

    def grid_server(self) -> dict[str, Any] | None:
        value = (self.data.get("engine_args") or {}).get("server") if isinstance(self.data.get("engine_args"), dict) else None
        return None if value is None else self.server(value, "engine_args.server")

    def positive_int(self, key: str, default: int) -> int:
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.fail(key, f"expected an integer >= 1, got {_show(value)}")
        return value

    def batch_size(self) -> int:
        value = self.data.get("batch_size", DEFAULT_BATCH_SIZE)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.fail("batch_size", f"expected an integer >= 1, got {_show(value)}")
        return value

    def timeout(self) -> float | None:
        value = self.data.get("timeout")
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < math.inf:
            raise self.fail("timeout", f"expected a number of seconds > 0, got {_show(value)}")
        return float(value)

    def slice_by(self) -> tuple[str, ...] | None:
        from pytest_redline.slices import check_slice_by

        try:
            return check_slice_by(self.data.get("slice_by"))
        except ValueError as e:
            raise self.fail("slice_by", str(e)) from None

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {_show(value)}")
        return value

    def configs(self) -> tuple[ConfigSpec, ...] | None:
        value = self.data.get("configs")
        if value is None:
            return None
        if isinstance(value, list):
            return self.config_list(value)
        if not isinstance(value, dict) or not value:
            raise self.fail("configs", f"expected a non-empty mapping of name -> parameters, got {_show(value)}")
        return tuple(self.config(name, params) for name, params in value.items())

    def config_list(self, names: list) -> tuple[ConfigSpec, ...]:
        """``configs: [a, b]``: names of recorded configs (replay), in a chosen order."""
        if not names:
            raise self.fail("configs", "expected at least one config name, got an empty list")
        seen = set()
        for i, name in enumerate(names):
            if not isinstance(name, str) or not name.strip():
                raise self.fail(f"configs[{i}]", f"expected a config name, got {_show(name)}")
            if name in seen:
                raise self.fail(f"configs[{i}]", f"expected distinct config names, got {name!r} twice")
            seen.add(name)
        return tuple(ConfigSpec(name, None, None, {}) for name in names)

    def config(self, name: Any, params: Any) -> ConfigSpec:
        key = f"configs.{name}"
        if not isinstance(name, str) or not name.strip():
            raise self.fail("configs", f"expected string config names, got {_show(name)}")
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise self.fail(key, f"expected a mapping of engine parameters, got {_show(params)}")
        params = dict(params)
        engine = params.pop("engine", None)
        if engine is not None and (not isinstance(engine, str) or not engine.strip()):
            raise self.fail(f"{key}.engine", f"expected an engine name, got {_show(engine)}")
        args = self.args(f"{key}.engine_args", params.pop("engine_args", None))
        server = params.pop("server", None)
        if server is not None:  # a config's own server: one of its engine arguments
            if "server" in args:
                raise self.fail(f"{key}.server", "expected one server: given here and in its engine_args")
            args["server"] = self.server(server, f"{key}.server")
        if engine is None and "model" not in args:  # the grid's model, given to this config's server
            inherited = self.data.get("engine_args") or {}
            if servers.uses_model(args.get("server")) and isinstance(inherited.get("model"), str):
                args["model"] = inherited["model"]
        self.server_model(args, args.get("server") or (None if engine else self.grid_server()))
        for param in params:
            if not isinstance(param, str):
                raise self.fail(key, f"expected string parameter names, got {_show(param)}")
        if "path" in params:  # a recorded run's log (lm_eval, inspect)
            params["path"] = self.resolve("path", params["path"])
        return ConfigSpec(name, params, engine, args)


# --------------------------------------------------------------------------- YAML


def _load_yaml(text: str, path: Path) -> Any:
    import yaml

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        _check_duplicates(node, "", path)
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise GridError(path, where, f"malformed YAML: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise GridError(path, "", f"malformed YAML: {e}") from None


def _check_duplicates(node: Any, key_path: str, path: Path) -> None:
    """YAML silently keeps the last of two equal keys; a grid must not (configs would vanish)."""
    import yaml

    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            line = key_node.start_mark.line + 1
            if key in seen:
                what = "config name" if key_path == "configs" else "key"
                raise GridError(
                    path, f"{key_path}.{key}" if key_path else str(key),
                    f"duplicate {what} (lines {seen[key]} and {line}); expected each once",
                )
            seen[key] = line
            _check_duplicates(value_node, f"{key_path}.{key}" if key_path else str(key), path)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_duplicates(item, f"{key_path}[{i}]", path)


def _suggest(key: str, valid: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{hint} (valid keys: {', '.join(valid)})"


def _kind(value: Any) -> str:
    return "an empty file" if value is None else type(value).__name__


def _show(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"
