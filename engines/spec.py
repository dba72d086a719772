"""The model-free half of an engine: what the gate needs before, or instead of, building it.

An engine class derives from an :class:`EngineSpec` that holds its name, its config parser
(``Config.from_params``), its constructor's arguments and defaults, and its model-free
methods (``check_config``, ``check_engine_args``, ``identity``). The entry point names the
spec, and the spec's module imports no torch, so preparing a grid and keying a warm rerun's
stored outcomes never import torch or transformers (3-6 s on a small CPU). Calling the spec
builds the engine, importing the engine's module only then.

Also the two parameter checks every engine's ``Config`` uses: :func:`with_defaults` and
:func:`check_params`. A ``Config`` is a frozen dataclass whose fields declare the parameters,
their defaults and what they mean, once: :func:`defaults` reads them.
"""
from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any, Mapping, Sequence

from pytest_redline.contracts import ConfigError
from pytest_redline.engines.runtime import cache_weight_hashes


class EngineSpec:
    """The model-free half of an engine class; the engine class derives from it.

    A spec names its engine class (``engine = "module:Class"``) and declares the constructor's
    arguments with their defaults (``engine_args``; a test checks them against the engine's
    ``__init__``). Calling the spec builds the engine, importing its module only then, as
    ``pathlib.Path(...)`` builds a ``PosixPath``. So the gate can check configs, check engine
    arguments and key outcomes through the entry point without importing torch.
    """

    name: str = ""
    engine: str = ""  # "module:Class", set on the spec itself (the registered entry point)
    engine_args: Mapping[str, Any] = {}
    Config: Any = None  # parses a config's parameters: Config.from_params(params)

    def __new__(cls, *args: Any, **kwargs: Any):
        if "engine" in cls.__dict__:  # the spec itself: build the engine class it names
            module, _, name = cls.engine.partition(":")
            cls = getattr(importlib.import_module(module), name)
        return object.__new__(cls)

    @classmethod
    def check_config(cls, params: Mapping[str, Any]) -> None:
        """The model-free parameter check: a :class:`ConfigError` naming the key and value of a bad config."""
        cls.Config.from_params(params)

    @classmethod
    def arguments(cls, engine_args: Mapping[str, Any], cache_dir: str | Path | None = None) -> dict[str, Any]:
        """``engine_args`` over the constructor's defaults (a TypeError names an unknown argument,
        as the constructor would); weight hashes are cached in ``cache_dir`` from now on."""
        unknown = sorted(set(engine_args) - set(cls.engine_args))
        if unknown:
            raise TypeError(f"{cls.name}: unknown engine argument {unknown[0]!r}; known: {', '.join(cls.engine_args)}")
        cache_weight_hashes(cache_dir)
        return {**cls.engine_args, **engine_args}


def defaults(config: type) -> dict[str, Any]:
    """The parameters of the dataclass ``config`` and their defaults, in field order."""
    out = {}
    for f in dataclasses.fields(config):
        out[f.name] = f.default_factory() if f.default is dataclasses.MISSING else f.default
    return out


def with_defaults(engine: str, params: Mapping[str, Any], config: type) -> dict[str, Any]:
    """A config's parameters over the defaults of the dataclass ``config``'s fields; an unknown
    key is a :class:`ConfigError` that names it and lists the known ones."""
    values = defaults(config)
    unknown = sorted(set(params) - set(values))
    if unknown:
        raise ConfigError(unknown[0], f"{engine}: unknown config key {unknown[0]!r}; known keys: {', '.join(values)}", tuple(values))
    return {**values, **params}


def check_params(
    engine: str,
    values: Mapping[str, Any],
    ints: Mapping[str, int],
    numbers: Sequence[str] = (),
    flags: Sequence[str] = (),
) -> None:
    """A :class:`ConfigError` naming the engine, the key and the value unless ``values[key]`` is an
    int of at least ``ints[key]`` (bools are not ints), a number >= 0 for each key of ``numbers``,
    and a bool for each key of ``flags``."""
    for key, least in ints.items():
        if isinstance(values[key], bool) or not isinstance(values[key], int) or values[key] < least:
            raise ConfigError(key, f"{engine}: {key}: expected int >= {least}, got {values[key]!r}")
    for key in numbers:
        if isinstance(values[key], bool) or not isinstance(values[key], (int, float)) or values[key] < 0:
            raise ConfigError(key, f"{engine}: {key}: expected a number >= 0, got {values[key]!r}")
    for key in flags:
        if not isinstance(values[key], bool):
            raise ConfigError(key, f"{engine}: {key}: expected true or false, got {values[key]!r}")
