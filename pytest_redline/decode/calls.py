"""The engine call and scoring: batches to the engine, each answer scored and stored."""
from __future__ import annotations

import math
import numbers
import time
import traceback
from typing import Any, Sequence

from pytest_redline import costbounds
from pytest_redline.contracts import Generation, PartialBatch, Prompt
from pytest_redline.decode import pipeline
from pytest_redline.decode.items import Batch, DecodeError
from pytest_redline.decode.progress import Progress
from pytest_redline.decode.store import StoredOutcome
from pytest_redline.scoring import engine_prompts, judgement


class Calls:
    """The engine call and scoring: a batch through ``generate`` (or an I/O-bound engine's
    pipeline), each answer scored, checked against its bounds and stored (part of
    :class:`~pytest_redline.decode.decoder.Decoder`)."""

    def _get(self, config: str, batches: Sequence[Batch], tracker: "Progress | None" = None, what: str = "prompts") -> None:
        if config in self._config_errors:
            return
        own = tracker is None
        if own:
            tracker = Progress(self, config, sum(len(b.prompts) for b in batches), len(batches), what)
        if pipeline.pipelined(self, config):  # an I/O-bound engine: every batch's requests at once
            pipeline.decode_batches(self, config, batches, tracker)  # each batch's keys made as it is prepared
            if own:
                tracker.finish()
            return
        try:
            keys = {b: self._keys(config, b) for b in batches}
        except Exception as e:  # the engine failed to build, or its fingerprint raised
            self._config_failed(config, e)
            return
        self._warn_shared_keys(config, [k for ks in keys.values() for k in ks])
        pending = list(batches)
        while True:
            for b in list(pending):
                if self._load(config, b, keys[b]):
                    pending.remove(b)
                    tracker.step(len(b.prompts), decoded=False)
                elif self._run_leased(config, b, keys[b]):
                    pending.remove(b)
                    tracker.step(len(b.prompts), decoded=True)
            if not pending:
                break
            time.sleep(self.poll_s)  # batches another process is decoding
        if own:
            tracker.finish()

    def _decode(self, config: str, batch: Batch, keys: list[str]) -> None:
        engine_name, engine_args = self.cal.engines[config]
        where = f"batch {batch.number} of config {config!r} ({_span(batch, [self.cal.prompts[i] for i in batch.prompts])})"
        bounds = self._bounds_of(config)  # declared before decoding
        start = time.monotonic()
        missing: dict[int, BaseException] = {}  # prompt index -> why a partial batch has no answer for it
        try:
            engine = self.engines.get(engine_name, engine_args)
            if getattr(engine, "batch_invariant", False):  # the batch changes no answer: send only what is missing
                kept = [(i, k) for i, k in zip(batch.prompts, keys) if i not in self._outcomes[config]]
                batch, keys = Batch(batch.number, tuple(i for i, _ in kept)), [k for _, k in kept]
            prompts = [self.cal.prompts[i] for i in batch.prompts]
            try:
                generations = self.runner.generate(engine, engine_prompts(self.cal, prompts), self.cal.params[config])
            except PartialBatch as e:  # keep every answer received
                generations = [e.generations.get(j) for j in range(len(prompts))]
                missing = {batch.prompts[j]: error for j, error in e.errors.items()}
            if len(generations) != len(prompts):
                raise ValueError(f"returned {len(generations)} generations for {len(prompts)} prompts")
        except Exception as e:
            error = DecodeError(f"engine {engine_name!r} failed on {where}: {type(e).__name__}: {e}", traceback.format_exc(),
                                short=f"engine {engine_name!r} failed on {where}")
            for i in batch.prompts:
                if i not in self._outcomes[config]:
                    self._errors[(config, i)] = error
            return
        finally:
            self.config_seconds[config] = self.config_seconds.get(config, 0.0) + time.monotonic() - start
        for i, key, prompt, generation in zip(batch.prompts, keys, prompts, generations):
            if i in self._outcomes[config]:
                continue  # stored before the batch was decoded again
            if generation is None:
                error = missing.get(i)
                self._prompt_failed(config, i, f"engine {engine_name!r} got no answer for prompt {prompt.id!r} on {where}: "
                                    f"{type(error).__name__}: {error}", "")
                continue
            self._accept(config, i, key, prompt, generation, engine_name, bounds)

    def _accept(self, config: str, i: int, key: str, prompt: Prompt, generation: Generation, engine_name: str,
                bounds: Any) -> None:
        """Score one answer and store it, unless it cannot be scored or breaks its engine's bounds."""
        try:
            outcome = self._score(prompt, generation)
        except Exception as e:
            self._errors[(config, i)] = DecodeError(
                f"scoring prompt {prompt.id!r} of config {config!r} failed: {type(e).__name__}: {e}", traceback.format_exc()
            )
            return
        broken = bounds and costbounds.violation(bounds, outcome, next(iter(self._outcomes[config].values()), None))
        if broken:  # an engine error: the run is partial; not stored, so a rerun decodes it again
            self._errors[(config, i)] = DecodeError(
                f"engine {engine_name!r} broke its declared cost bounds on config {config!r}, prompt {prompt.id!r}: {broken}")
            return
        self.store.put(key, outcome, grid=self.cal.grid.name, config=config, prompt=prompt.id)
        self._outcomes[config][i] = outcome

    def _prompt_failed(self, config: str, i: int, message: str, details: str) -> None:
        """No outcome for prompt ``i``: an item error (a rerun decodes it again)."""
        self._errors[(config, i)] = DecodeError(message, details, short=message.split(": ", 1)[0] if ": " in message else message)

    def _config_failed(self, config: str, error: Exception) -> None:
        """The config's engine failed to build, or its identity raised: every item is an error."""
        self._config_errors.setdefault(config, DecodeError(
            f"config {config!r}: {error}", traceback.format_exc(), short=f"config {config!r}: its engine failed to build"))

    def _score(self, prompt: Prompt, generation: Generation) -> StoredOutcome:
        if not isinstance(generation.text, str):
            raise TypeError(f"Generation.text must be a str, got {type(generation.text).__name__}")
        return StoredOutcome(
            **judgement(self.cal, prompt, generation, self.scoring),
            tokens=_finite_or_none(generation.tokens, "tokens"),
            forwards=_finite_or_none(generation.forwards, "forwards"),
            extra={str(k): _finite_or_none(v, f"extra[{k!r}]") for k, v in dict(generation.extra).items()},
            text=generation.text,
            session=self.session,
        )


def _span(batch: Batch, prompts: list) -> str:
    first, last = prompts[0].id, prompts[-1].id
    if batch.prompts[-1] - batch.prompts[0] == len(batch.prompts) - 1:
        return f"prompts {first} .. {last}"
    return f"{len(prompts)} scheduled prompts from {first} to {last}"


def _finite_or_none(value: Any, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise TypeError(f"Generation.{what} must be a finite number or None, got {value!r}")
    return float(value)
