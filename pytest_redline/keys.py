"""The outcome store's keys: what an outcome depends on, by identity, never by place.

A key is the SHA-256 (:func:`~pytest_redline.decode.store.content_key`) of these fields:

- ``decode_format``: :data:`DECODE_FORMAT`, the version of what a decode of the same inputs gives;
- ``engine``: the engine's entry-point name, its ``engine_args`` (those its class keys), its
  ``fingerprint()`` (the weights) and its ``describe()`` (device, dtype, library versions, ...);
- ``params``: the config's parameters (a recorded run's ``logs_sha256`` among them);
- ``suite``: the suite's entry-point name and ``suite_args`` (None for a grid without a suite);
  not its class's module, and not its scoring version, so that a new scoring re-scores stored
  texts and decodes nothing;
- ``batch``: the batch size and the ids of the batch's prompts (batched decoding can change an
  answer in its last bits); absent for an engine that declares ``batch_invariant`` (an HTTP
  server forms its own batches; a recorded log holds one answer per prompt);
- ``prompt``: the prompt's id, text, chat messages and metadata; ``stop``: its stop strings and
  whether the engine honours them.

**Inputs by content.** Wherever one of these fields holds an input path (a value under one of
:data:`~pytest_redline.grid.INPUT_PATH_KEYS`, such as ``model``, ``outcomes`` or ``path``, that is
the absolute path of an existing file or folder), the key holds :func:`content_identity` of it
instead. So a second clone, or a CI runner with another work directory, hits the same keys.

**One chain of legacy lookups.** :meth:`OutcomeKeys.chain` gives a batch's keys in every format,
newest first (:data:`FORMATS`): :meth:`OutcomeKeys.current`, then :meth:`OutcomeKeys.older`. The
decoder looks each outcome up under the newest key, then under each older one in order, and
copies what an older key finds to the newest.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from pytest_redline.content import ContentHashes, content_identity
from pytest_redline.contracts import Prompt
from pytest_redline.grid import INPUT_PATH_KEYS
from pytest_redline.scoring import engine_prompts, stop_identity
from pytest_redline.decode.store import content_key

if TYPE_CHECKING:
    from pytest_redline.calibration import Calibration
    from pytest_redline.decode.enginebook import EngineBook

# Changes only when a release can change an answer that no other field of the key captures (how
# prompts reach the engines, how batches form, how a generation becomes an outcome). A release
# that changes it says so in the CHANGELOG; its stores are then cold, by design.
DECODE_FORMAT = 1
FORMATS = ("identity", "place", "pre-stop")  # the chain, newest first; see OutcomeKeys.chain
PLACE_PACKAGE = "0.1.0"  # the package version that the older formats hold (the only one that wrote them)
def by_content(value: Any, hashes: ContentHashes | None = None, key: str = "") -> Any:
    """``value`` with every input path replaced by its :func:`content_identity`: a string under an
    input-path key (:data:`~pytest_redline.grid.INPUT_PATH_KEYS`) that is the absolute path of an
    existing file or folder, at any depth of mappings and lists. Other strings (a served model's
    name, a path that does not exist) stay as they are."""
    if isinstance(value, Mapping):
        return {k: by_content(v, hashes, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [by_content(v, hashes, key) for v in value]
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if key in INPUT_PATH_KEYS and isinstance(value, str) and os.path.isabs(value) and os.path.exists(value):
        return content_identity(value, hashes)
    return value


def scorer_name(cal: Calibration) -> str:
    """The suite's class as the older key formats and the scoring version name it (its module as
    before engines/ and suites/ installed under pytest_redline); empty without a suite."""
    if cal.suite is None:
        return ""
    kind = type(cal.suite)
    return f"{kind.__module__.removeprefix('pytest_redline.')}.{kind.__qualname__}"


def suite_identity(cal: Calibration, hashes: ContentHashes | None = None) -> dict[str, Any] | None:
    """The suite as the key holds it: its entry-point name and arguments, inputs by content."""
    if cal.suite is None:
        return None
    return {"suite": cal.grid.suite, "suite_args": by_content(dict(cal.grid.suite_args), hashes)}


def prompt_identity(prompt: Prompt) -> dict[str, Any]:
    return {"id": prompt.id, "text": prompt.text, "messages": list(prompt.messages), "meta": dict(prompt.meta)}


class OutcomeKeys:
    """The outcome keys of one grid's batches, in every format of the legacy chain.

    :param cal: the grid's calibration (configs, params, suite, prompts).
    :param engines: the session's engines; only their identity is asked (a warm rerun builds none).
    :param hashes: the cache of file hashes for the inputs' content identities.
    """

    def __init__(self, cal: Calibration, engines: EngineBook, hashes: ContentHashes | None = None) -> None:
        self.cal, self.engines, self.hashes = cal, engines, hashes if hashes is not None else ContentHashes()
        self._engine: dict[str, dict[str, Any]] = {}
        self._params: dict[str, Any] = {}
        self._suite: dict[str, Any] | None = None
        self._invariant: dict[str, bool] = {}

    def current(self, config: str, prompts: Sequence[Prompt], batched: bool | None = None) -> list[str]:
        """The keys of a batch (its prompts in order) in the newest format, ``identity``: without
        the ``batch`` field for a batch-invariant engine (``batched``: force it in or out)."""
        cal = self.cal
        shared = {"decode_format": DECODE_FORMAT, "engine": self._engine_identity(config),
                  "params": self._config_params(config), "suite": self._suite_identity(), "batch": self._batch(prompts)}
        if not (batched if batched is not None else not self.batch_invariant(config)):
            del shared["batch"]  # the gate's batch cannot change this engine's answers
        return [content_key({**shared, "prompt": prompt_identity(p), "stop": stop_identity(cal, p)}) for p in prompts]

    def batch_invariant(self, config: str) -> bool:
        """Whether the config's engine declares that the gate's batch cannot change an answer."""
        from pytest_redline import registry

        if config not in self._invariant:
            try:
                factory = registry.factory(registry.ENGINES, self.cal.engines[config][0])
            except Exception:  # reported where the engine is built
                factory = None
            self._invariant[config] = bool(getattr(factory, "batch_invariant", False))
        return self._invariant[config]

    def older(self, config: str, prompts: Sequence[Prompt]) -> list[list[str | None]]:
        """A batch's keys in each older format of :data:`FORMATS`, in order; None where a format
        cannot hold the prompt's outcome:

        - ``place``: inputs by absolute path, the suite also by its class (:func:`scorer_name`),
          and ``package: 0.1.0`` instead of the decode format;
        - ``pre-stop``: as ``place``, with the suite's version in the key and no stop strings;
          only for prompts that the engine gets without stop strings, as then.

        A batch-invariant engine's list starts with its ``identity`` keys with the ``batch``
        field, as they were before it declared itself batch-invariant.
        """
        cal = self.cal
        shared = {"engine": self.engines.identity(*cal.engines[config]), "params": cal.params[config],
                  "batch": self._batch(prompts), "package": PLACE_PACKAGE}
        suite = None if cal.suite is None else {"suite": cal.grid.suite, "suite_args": dict(cal.grid.suite_args),
                                                "scorer": scorer_name(cal)}
        place = [content_key({**shared, "suite": suite, "prompt": prompt_identity(p), "stop": stop_identity(cal, p)})
                 for p in prompts]
        versioned = None if suite is None else {**suite, "version": str(getattr(cal.suite, "version", ""))}
        pre_stop = [None if stop else content_key({**shared, "suite": versioned, "prompt": prompt_identity(p)})
                    for p, stop in zip(prompts, [p.stop for p in engine_prompts(cal, list(prompts))])]
        if self.batch_invariant(config):  # its outcomes were keyed by their batch before: found when it forms again
            return [self.current(config, prompts, batched=True), place, pre_stop]
        return [place, pre_stop]

    def chain(self, config: str, prompts: Sequence[Prompt]) -> list[list[str | None]]:
        """A batch's keys in every format of :data:`FORMATS`, newest first."""
        return [self.current(config, prompts), *self.older(config, prompts)]

    def _batch(self, prompts: Sequence[Prompt]) -> dict[str, Any]:
        return {"size": self.cal.grid.batch_size, "prompts": [p.id for p in prompts]}

    def _suite_identity(self) -> dict[str, Any] | None:
        if self._suite is None and self.cal.suite is not None:  # here, not at start: an unreadable input is the batch's error
            self._suite = suite_identity(self.cal, self.hashes)
        return self._suite

    def _engine_identity(self, config: str) -> dict[str, Any]:
        name, args = self.cal.engines[config]
        if config not in self._engine:
            self._engine[config] = by_content(self.engines.identity(name, args), self.hashes)
        return self._engine[config]

    def _config_params(self, config: str) -> Any:
        if config not in self._params:
            self._params[config] = by_content(self.cal.params[config], self.hashes)
        return self._params[config]
