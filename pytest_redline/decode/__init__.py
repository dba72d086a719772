"""Getting outcomes: from the store when it has them, else from the engine, in batches.

A :class:`Decoder` serves one grid in one process. It knows which (config, prompt)
outcomes the session needs (:meth:`Decoder.need`, from the selected items). Each outcome
is loaded from the store or decoded by ``engine.generate(batch, params)``, scored by the
suite unless the engine set ``correct``, and committed to the store one outcome at a time.

- The reference, and every config in a full run (``--redline-full``, or a partial
  selection), is decoded in fixed batches of ``batch_size`` prompts in prompt order (so a
  batch is always the same prompts, whatever was selected): the first outcome asked of a
  config gets all that config's needed batches.
- Otherwise candidates follow the :class:`~pytest_redline.schedule.Schedule`: the first
  outcome asked of a candidate gets the reference's outcomes on every prompt, then decodes
  each candidate's scheduled batches one after another until its certification is decided,
  visiting first the batches where the candidates before it regressed (the adaptive order).
  Its other items are :class:`Skipped` on purpose.

Several processes (xdist workers) share the store: a process takes a lease on a batch
before decoding it, and waits for batches whose lease another live process holds. So each
batch, the reference's included, is decoded once, and a worker that needs the reference
waits for the batches others decode. The schedule is a function of the reference's
outcomes and the seed, so every worker follows the same one.

An I/O-bound engine (an HTTP server) goes through :mod:`~pytest_redline.decode.pipeline`
instead: one request per prompt, ``concurrency`` in flight across a config's batches.

The package has one module per job: :mod:`~pytest_redline.decode.plan` (what to decode next:
the reference, the candidates' schedules, the contenders), :mod:`~pytest_redline.decode.storage`
(the keys of a batch, the legacy lookup, leases, rescoring) over
:mod:`~pytest_redline.decode.store` (the SQLite store) and :mod:`pytest_redline.keys`,
:mod:`~pytest_redline.decode.calls` (the engine call and scoring) with
:mod:`~pytest_redline.decode.batchrun`, :mod:`~pytest_redline.decode.pipeline` and
:mod:`~pytest_redline.decode.enginebook` (the session's engines), and
:mod:`~pytest_redline.decode.progress`. :class:`~pytest_redline.decode.decoder.Decoder` is made
of the first three.
"""
from __future__ import annotations

from typing import Any

# Re-exported lazily, so that importing one module of the package (the store, by the report)
# loads no other.
_EXPORTS = {"Decoder": "decoder", "DecodeError": "items", "Skipped": "items", "Batch": "items",
            "PROGRESS_EVERY_S": "progress"}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
