"""Engines built once per session, per (engine name, engine_args); the model loads then.

An engine that fails to build fails once: the error is kept and raised again to every
config that needs it, so a broken model is not reloaded for each prompt.

An engine's identity (the outcome store's key) comes without building it when its class has a
model-free ``identity(engine_args)`` classmethod, so a rerun whose outcomes are all stored loads
no model; an engine built later must describe itself exactly as that identity said.

The identity names model folders by path, as the engine does; the outcome key holds them by
content (:func:`pytest_redline.keys.by_content`).

Engine arguments with a ``server:`` (:mod:`pytest_redline.servers`) are built through the
book's :class:`~pytest_redline.servers.ServerPool`: building the engine starts its server (or
reuses it) and fills its port in ``base_url``; the server's identity, not its port, enters the key.
"""
from __future__ import annotations

import inspect
import json
import os
from typing import Any, Callable, Mapping

from pytest_redline import registry, servers
from pytest_redline.contracts import Engine

# Attributes an engine may expose instead of describe(); they enter the outcome store's key.
DESCRIBED = ("device", "dtype", "torch_version", "seed")


class EngineBuildError(Exception):
    """The engine's factory raised; the message names the engine and its arguments."""


def args_key(name: str, args: Mapping[str, Any]) -> str:
    return json.dumps([name, args], sort_keys=True, default=str)


def describe(engine: Engine) -> dict[str, str]:
    """What the engine reports about where and how it runs (device, dtype, torch version...).

    ``engine.describe()`` when it has one, else the attributes of :data:`DESCRIBED` it has.
    """
    if hasattr(engine, "describe"):
        return {str(k): str(v) for k, v in dict(engine.describe()).items()}
    return {attr: str(getattr(engine, attr)) for attr in DESCRIBED if hasattr(engine, attr)}


def key_args(name: str, args: Mapping[str, Any],
             model_identity: Callable[[str], str] = servers.folder_identity) -> dict[str, Any]:
    """The engine_args that enter the outcome key: all of them, unless the engine's class
    names the ones that cannot change an outcome (an endpoint's URL, its retry settings)
    with a ``key_args(engine_args)`` static method. A ``server`` enters by its identity (its
    command and flags, its ``{model}`` folder by ``model_identity``), never by its port."""
    server, args = args.get("server"), {k: v for k, v in args.items() if k != "server"}
    factory = registry.factory(registry.ENGINES, name)
    out = dict(factory.key_args(args)) if hasattr(factory, "key_args") else dict(args)
    if server is not None:
        out["server"] = servers.server_identity(server, args.get("model"), model_identity)
    return out


class EngineBook:
    """The session's engines, and their identity for the outcome store."""

    def __init__(self, cache_dir: str | os.PathLike | None = None, pool: servers.ServerPool | None = None) -> None:
        self.cache_dir = cache_dir  # beside the outcome store: where engines may cache what identifies them
        self.servers = pool  # starts the servers of engine_args with a `server:` (the gate sets it)
        self._engines: dict[str, Engine] = {}
        self._failures: dict[str, EngineBuildError] = {}
        self._identities: dict[str, dict[str, Any]] = {}

    def get(self, name: str, args: Mapping[str, Any]) -> Engine:
        key = args_key(name, args)
        if key in self._failures:
            raise self._failures[key]
        built_key, build_args = key, args
        if args.get("server") is not None:  # start (or reuse) its server: a new port is a new engine
            try:
                build_args = self._served(args)
            except Exception as e:
                self._failures[key] = EngineBuildError(f"engine {name!r}: its server failed: {e}")
                raise self._failures[key] from e
            built_key = args_key(name, build_args)
        if built_key not in self._engines:
            try:
                engine = registry.factory(registry.ENGINES, name)(**build_args)
            except Exception as e:
                self._failures[key] = EngineBuildError(f"engine {name!r} with engine_args {dict(build_args)!r} failed to build: {type(e).__name__}: {e}")
                raise self._failures[key] from e
            try:
                self._check_identity(key, name, engine)
            except EngineBuildError as e:
                self._failures[key] = e
                raise
            self._engines[built_key] = engine
        return self._engines[built_key]

    def _served(self, args: Mapping[str, Any]) -> dict[str, Any]:
        if self.servers is None:
            raise servers.ServerError("no server pool in this process (only the gate starts servers)")
        return self.servers.resolve(args)

    @property
    def built_any(self) -> bool:
        """Whether this session built (or tried to build) an engine."""
        return bool(self._engines or self._failures)

    def known_identity(self, name: str, args: Mapping[str, Any]) -> dict[str, Any] | None:
        """The identity if this session has computed it, else None (never builds an engine)."""
        return self._identities.get(args_key(name, args))

    def identity(self, name: str, args: Mapping[str, Any]) -> dict[str, Any]:
        """Everything about the engine that an outcome depends on.

        Model-free when the engine class has ``identity(engine_args)`` (returning what the built
        engine's ``fingerprint()`` and ``describe()`` would): a rerun whose outcomes are all
        stored then builds no engine. Otherwise, or when it raises, the engine is built.
        """
        key = args_key(name, args)
        if key not in self._identities:
            found = _model_free(name, {k: v for k, v in args.items() if k != "server"}, self.cache_dir)
            if found is None:
                engine = self.get(name, args)
                found = {"fingerprint": engine.fingerprint(), "runtime": describe(engine)}
            self._identities[key] = {"engine": name, "engine_args": key_args(name, args), **found}
        return self._identities[key]

    def _check_identity(self, key: str, name: str, engine: Engine) -> None:
        """A built engine must describe itself as its model-free identity said (the outcome key)."""
        known = self._identities.get(key)
        if known is None:
            return
        built = {"fingerprint": engine.fingerprint(), "runtime": describe(engine)}
        for part in ("fingerprint", "runtime"):
            if built[part] != known[part]:
                raise EngineBuildError(
                    f"engine {name!r}: its model-free identity() differs from the built engine's {part}: "
                    f"{known[part]!r} against {built[part]!r}; outcomes keyed by it would be wrong"
                )


def _model_free(name: str, args: Mapping[str, Any], cache_dir) -> dict[str, Any] | None:
    """The engine class's ``identity(engine_args[, cache_dir=...])``, as the key stores it (None:
    it has none, or it raised). ``cache_dir`` is passed when the method takes it (ours keep their
    weight hashes there, by path, size and modification time)."""
    try:
        model_free = getattr(registry.factory(registry.ENGINES, name), "identity", None)
        if not callable(model_free):
            return None
        takes_dir = "cache_dir" in inspect.signature(model_free).parameters
        found = model_free(dict(args), **({"cache_dir": cache_dir} if takes_dir else {}))
        return {"fingerprint": str(found["fingerprint"]), "runtime": {str(k): str(v) for k, v in dict(found["runtime"]).items()}}
    except Exception:  # building the engine reports the error properly (or identifies it once built)
        return None
