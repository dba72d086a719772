"""Engines built once per session, per (engine name, engine_args); the model loads then.

An engine that fails to build fails once: the error is kept and raised again to every
config that needs it, so a broken model is not reloaded for each prompt.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from pytest_redline import registry

# Attributes an engine may expose instead of describe(); they enter the outcome store's key.
DESCRIBED = ("device", "dtype", "torch_version", "seed")


class EngineBuildError(Exception):
    """The engine's factory raised; the message names the engine and its arguments."""


def args_key(name: str, args: Mapping[str, Any]) -> str:
    return json.dumps([name, args], sort_keys=True, default=str)


def describe(engine: Any) -> dict[str, str]:
    """What the engine reports about where and how it runs (device, dtype, torch version...).

    ``engine.describe()`` when it has one, else the attributes of :data:`DESCRIBED` it has.
    """
    if hasattr(engine, "describe"):
        return {str(k): str(v) for k, v in dict(engine.describe()).items()}
    return {attr: str(getattr(engine, attr)) for attr in DESCRIBED if hasattr(engine, attr)}


def key_args(name: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """The engine_args that enter the outcome key: all of them, unless the engine's class
    names the ones that cannot change an outcome (an endpoint's URL, its retry settings)
    with a ``key_args(engine_args)`` static method."""
    factory = registry.factory(registry.ENGINES, name)
    return dict(factory.key_args(args)) if hasattr(factory, "key_args") else dict(args)


class EngineBook:
    """The session's engines, and their identity for the outcome store."""

    def __init__(self) -> None:
        self._engines: dict[str, Any] = {}
        self._failures: dict[str, EngineBuildError] = {}
        self._identities: dict[str, dict[str, Any]] = {}

    def get(self, name: str, args: Mapping[str, Any]) -> Any:
        key = args_key(name, args)
        if key in self._failures:
            raise self._failures[key]
        if key not in self._engines:
            try:
                self._engines[key] = registry.factory(registry.ENGINES, name)(**args)
            except Exception as e:
                self._failures[key] = EngineBuildError(f"engine {name!r} with engine_args {dict(args)!r} failed to build: {type(e).__name__}: {e}")
                raise self._failures[key] from e
        return self._engines[key]

    def known_identity(self, name: str, args: Mapping[str, Any]) -> dict[str, Any] | None:
        """The identity if this session has computed it, else None (never builds an engine)."""
        return self._identities.get(args_key(name, args))

    def identity(self, name: str, args: Mapping[str, Any]) -> dict[str, Any]:
        """Everything about the engine that an outcome depends on (builds the engine)."""
        key = args_key(name, args)
        if key not in self._identities:
            engine = self.get(name, args)
            self._identities[key] = {
                "engine": name,
                "engine_args": key_args(name, args),
                "fingerprint": engine.fingerprint(),
                "runtime": describe(engine),
            }
        return self._identities[key]
