"""The vocabulary engines, suites and the gate share, and the protocols between them.

Engines and suites import only this module from the gate package (recorded-outcome engines may
also import :mod:`pytest_redline.outcomes`); engines never import suites nor suites engines; the
gate loads both only through their entry points (``redline.engines``, ``redline.suites``).
``tests/meta/test_imports.py`` enforces these rules. The module imports nothing but the standard
library, so an engine's model-free spec or a suite costs no start-up time by importing it.

- **Values**: :class:`Prompt` (what a suite asks), :class:`Generation` (what an engine answers),
  :class:`Judgement` (what a suite decides), the finish reasons (:data:`FINISH_REASONS`) and
  :func:`cut_at_stop`, which engines and scorers both use to end a text at a stop string, and
  :class:`ConfigError`, a bad config parameter whose fields the gate reads, and
  :class:`PartialBatch`, a batch whose answers were only partly received.
- **Protocols** (:class:`typing.Protocol`): :class:`Engine` and the engine class an entry point
  names (:class:`EngineFactory`), :class:`Recorded` (an engine that brings its own prompts and
  configs), :class:`Suite` and its richer scoring call (:class:`Judged`, dispatched by
  :func:`judge`), and the block-diffusion engines' :class:`BlockLifecycle`. Every optional
  member is found by ``getattr``, so an engine or suite without it keeps working; each protocol's
  docstring lists them with their exact signatures.
- :func:`moved` keeps a moved name importable from its old module for one release.
"""
from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

# ``Generation.finish_reason``: the engine stopped at an EOS token, at one of the prompt's stop
# strings, or at the token limit (None: the engine cannot tell).
FINISH_REASONS = ("eos", "stop", "length")

SCORED = "score"  # ``Judgement.rule`` of a suite without ``judge``: its plain ``score`` decided


@dataclass(frozen=True)
class Prompt:
    """One calibration prompt.

    ``text`` is the plain prompt; ``messages`` is the same prompt as chat messages
    (``[{"role": "user", "content": ...}]``), which an engine renders with its tokenizer's
    chat template when it has one. ``meta`` carries what the scorer needs (gold answer, tests).
    ``stop`` lists the stop strings an engine honours for this prompt: it ends the request at
    the first one and returns the text before it. The gate empties it when a grid turns
    engine-side stops off; the scorer still cuts at its suite's own stop strings.
    """

    id: str
    text: str
    messages: tuple[Mapping[str, str], ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Generation:
    """One engine answer. Counting conventions, shared by every engine:

    - ``forwards`` is every model call made for the request (prefill, denoising steps, cache
      stores or refreshes, verification). A batched call counts 1 for each request it serves.
    - ``tokens`` is the number of generated tokens up to and including the first EOS; token
      edits are not counted. A request cut at a stop string (``Prompt.stop``) counts the tokens
      and forwards up to the cut.
    - ``finish_reason`` is one of :data:`FINISH_REASONS`, or None when the engine cannot tell.
    - Breakdowns (prefill, draft forwards, FLOPs, memory, measured latencies) go to ``extra``.
    - ``correct`` is set only by engines that already know the judgement (replay): the gate then
      scores nothing.
    """

    text: str
    tokens: int
    forwards: int
    extra: Mapping[str, float] = field(default_factory=dict)
    correct: bool | None = None
    finish_reason: str | None = None


@dataclass(frozen=True)
class Judgement:
    """The judgement on one output: whether it is correct, the final answer extracted from it
    (None when there is none) and the rule that decided (the suite's own names, or
    :data:`SCORED`)."""

    correct: bool
    answer: str | None
    rule: str


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """``text`` before the earliest occurrence of any stop string, and whether one occurred."""
    hits = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    return (text[: min(hits)], True) if hits else (text, False)


class ConfigError(ValueError):
    """A bad config parameter or engine argument, found by an engine's model-free checks.

    ``key`` names the parameter (None: the config as a whole), ``message`` is the whole
    sentence a user reads (engine, key, what was expected, what was given; ``str()`` gives
    it), and ``known`` lists the keys the engine knows when ``key`` is not one of them. The
    gate reads the fields, never the text: it names ``configs.<config>.<key>`` in its usage
    error and suggests the closest of ``known``.
    """

    def __init__(self, key: str | None, message: str, known: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.key, self.message, self.known = key, message, tuple(known)

    def __reduce__(self):  # pickles (xdist, multiprocessing) with its fields
        return type(self), (self.key, self.message, self.known)


class PartialBatch(RuntimeError):
    """Raised by ``Engine.generate`` when some prompts of a batch got no answer: ``generations``
    holds the answers received (by the prompt's index in the batch), ``errors`` why each other
    prompt has none. The gate stores every answer received and makes each error an item error."""

    def __init__(self, message: str, generations: Mapping[int, Generation], errors: Mapping[int, BaseException]) -> None:
        super().__init__(message)
        self.generations, self.errors = dict(generations), dict(errors)

    def __reduce__(self):
        return type(self), (str(self), self.generations, self.errors)


@runtime_checkable
class Engine(Protocol):
    """A built engine: one per session and ``(engine, engine_args)``; the model loads when it is built.

    Required: ``name``, ``fingerprint()`` (what identifies the weights and code; it enters the
    outcome key) and ``generate(prompts, config)``, one :class:`Generation` per prompt, in order,
    for a config's parameters. An engine honours each prompt's ``stop`` strings.

    Optional:

    - ``describe() -> Mapping[str, str]``: where and how it runs (device, dtype, library
      versions...), entered into the outcome key; without it the attributes ``device``,
      ``dtype``, ``torch_version`` and ``seed`` that it has.
    - ``prompts()`` and ``configs()``: see :class:`Recorded`.
    - ``io_bound: bool`` (a class attribute; False when absent): its requests wait on something
      else (an HTTP server), so the decode stage keeps many in flight. Such an engine also has
      ``async complete(prompt, config) -> Generation``, one request, cancellation-safe (a
      cancelled request closes its connection), raising when the prompt fails for good.
    - ``batch_invariant: bool`` (a class attribute; False when absent): the gate's batch cannot
      change an answer (a server forms its own batches; a recorded log holds one answer per
      prompt), so the outcome key holds no batch membership and each answer is stored as it
      arrives. Batched in-process decoding with padding is not batch-invariant.
    - ``generate`` may raise :class:`PartialBatch` to hand over the answers it has when some
      prompts failed.
    """

    name: str

    def fingerprint(self) -> str: ...

    def generate(self, prompts: Sequence[Prompt], config: Mapping[str, Any]) -> list[Generation]: ...


# What reading an outcome costs: a declaration of the engine class (a class attribute, found by
# getattr; False when absent), kept apart from the protocols above.

#: ``read_every_outcome = True``: reading one of the engine's outcomes costs nothing (a recorded
#: log: ``lm_eval``, ``inspect``), so the gate reads every outcome of a grid whose configs all
#: declare it instead of scheduling them: a stop would save nothing and would hide the exact V.
#: ``replay`` does not declare it: showing what the schedule would spend on recorded data is its job.
READ_EVERY_OUTCOME = "read_every_outcome"


def reads_every_outcome(factory: Any) -> bool:
    """Whether an engine class declares :data:`READ_EVERY_OUTCOME`."""
    return bool(getattr(factory, READ_EVERY_OUTCOME, False))


@runtime_checkable
class EngineFactory(Protocol):
    """What an entry point of ``redline.engines`` names: a callable ``(**engine_args) -> Engine``,
    usually the engine class or its model-free spec (``pytest_redline.engines.spec``).

    Optional members of the class, all model-free (the gate calls them before any model loads):

    - ``check_config(params) -> None`` (classmethod): raise :class:`ConfigError` (key, message,
      known keys) for a bad config's parameters; the grid fails with exit 4 before decoding,
      naming ``configs.<config>.<key>``. Another ValueError/TypeError/KeyError fails it too,
      naming the config only.
    - ``check_engine_args(engine_args, params=None) -> Mapping[str, Any] | None`` (static or
      classmethod): raise ValueError/TypeError/OSError on unusable arguments (a checkpoint's
      family, block size, mask id). The gate calls it for each config with the config's
      ``params`` when the signature takes them, else once per ``engine_args``; the mapping
      returned (the values the engine will use, e.g. the block size) goes to the report as it
      is: the gate does not read it.
    - ``identity(engine_args, cache_dir=None) -> {"fingerprint": str, "runtime": {str: str}}``
      (classmethod): what the built engine's ``fingerprint()`` and ``describe()`` will say, so a
      warm rerun builds no engine; ``cache_dir`` (beside the outcome store) is passed when the
      signature takes it. The built engine must agree, else its outcomes are refused.
    - ``key_args(engine_args) -> Mapping[str, Any]`` (static): the arguments that can change an
      outcome, the only ones in the outcome key (an endpoint's URL and retries are not).
    - ``wall_time_costs: tuple[str, ...]``: the ``Generation.extra`` columns that are measured
      wall time; the report calls a ranking by them an estimate.
    - ``cost_bounds(engine_args, params) -> Mapping[str, tuple[float, float] | str] | None``
      (static or classmethod, model-free): hard bounds, per config and before decoding, on each
      prompt's cost fields: ``tokens``, ``forwards``, ``tokens_per_forward`` (the prompt's
      ``tokens / max(forwards, 1)``) and any ``Generation.extra`` column, each as ``(low, high)``
      (``high`` may be ``math.inf``) or ``"constant"`` (the same value on every prompt of the
      config, e.g. weight memory). Give only bounds that always hold: the gate checks every
      decoded prompt, and one outside its bounds is an engine error (the run is partial and
      certifies nothing). The scheduled run uses them to settle the deployment without decoding
      every contender on every prompt (``pytest_redline.costbounds``); an engine without them
      keeps the rule that decodes every valid candidate everywhere.
    """

    def __call__(self, **engine_args: Any) -> Engine: ...


@runtime_checkable
class Recorded(Protocol):
    """An engine that brings its own prompts and configs (``replay``): a grid without a suite
    takes both from it, and its generations carry ``correct``."""

    def prompts(self) -> Sequence[Prompt]: ...

    def configs(self) -> Mapping[str, Mapping[str, Any]]: ...


@runtime_checkable
class Suite(Protocol):
    """What an entry point of ``redline.suites`` builds from ``suite_args``: prompts and a scorer.

    Optional:

    - ``judge(prompt, text, finish_reason=None) -> Judgement``: see :class:`Judged`.
    - ``stop: Sequence[str]``: stop strings for prompts that declare none of their own.
    - ``version: str`` and ``rules: str``: what the judgements depend on beyond the data (a tool's
      version, the revision of the scoring rules). They enter the scoring version: when it
      changes, stored texts are judged again and nothing is decoded.
    """

    name: str

    def prompts(self) -> Sequence[Prompt]: ...

    def score(self, prompt: Prompt, text: str) -> bool: ...


@runtime_checkable
class Judged(Protocol):
    """The optional, richer scoring call of a suite: the generation's finish reason in (one of
    :data:`FINISH_REASONS`, or None when unknown), the answer and the deciding rule out."""

    def judge(self, prompt: Prompt, text: str, finish_reason: str | None = None) -> Judgement: ...


def judge(suite: Suite, prompt: Prompt, text: str, finish_reason: str | None = None) -> Judgement:
    """``suite.judge(...)`` when the suite has it, else its plain ``score`` as a Judgement."""
    if isinstance(suite, Judged):
        return suite.judge(prompt, text, finish_reason)
    return Judgement(bool(suite.score(prompt, text)), None, SCORED)


Reads = Mapping[int, list[tuple[int, float, int]]]  # block -> [(position, confidence, top-1 token)]


@dataclass(frozen=True)
class Step:
    """What one step's forward does for a request: ``queries`` are the positions it computes (the
    uncached final prefix first), ``reads`` the ``(block, position)`` pairs whose predictions the
    commit reads, and ``store`` the cached length after it (its K/V below ``store`` are kept)."""

    queries: list[int]
    reads: list[tuple[int, int]]
    store: int


@runtime_checkable
class BlockLifecycle(Protocol):
    """The block life cycle: the extension points of the block-diffusion engines.

    Each engine step calls, per request: ``admit`` (blocks that join the window now; returns
    them), ``step`` (the forward's queries and reads, a :class:`Step`), then after the batched
    forward ``commit`` (apply the read predictions; returns the ``(position, token)`` commits)
    and ``retire`` (blocks that become final, front to back; sets ``req.result`` and
    ``req.finish_reason`` when the request ends). ``req`` is the engine's request state and
    ``cfg`` its parsed config. Engines subclass ``BlockDiffusionEngine`` by overriding these four
    and the ``Config`` / ``Request`` classes, never a private method.
    """

    def admit(self, req: Any, cfg: Any) -> list[int]: ...

    def step(self, req: Any, cfg: Any) -> Step: ...

    def commit(self, req: Any, reads: Reads, cfg: Any) -> list[tuple[int, int]]: ...

    def retire(self, req: Any, cfg: Any) -> list[int]: ...


def moved(module: str, names: Sequence[str], to: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` that keeps ``names``, moved from ``module`` to ``to``, importable
    from ``module`` for one release, each use with a DeprecationWarning."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(f"{module}.{name} moved to {to}.{name}; the old name goes in pytest-redline 0.2",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(to), name)

    return __getattr__
