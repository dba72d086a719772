"""The request pipeline of an I/O-bound engine (``io_bound``, with ``async complete``).

Such an engine's requests wait on a server, so instead of one ``generate`` call per batch, each
prompt is one request and ``concurrency`` of them are kept in flight across a config's batches:

- :func:`decode_batches` sends every missing prompt of the given batches at once (the reference,
  a full run's config, the prompts a contender skipped);
- :func:`scheduled_run` follows the candidate's schedule exactly as
  :meth:`~pytest_redline.schedule.Schedule.run` does, but sends its batches ahead, as many as
  keep the pool full: the stop rule is checked as batches complete, in the schedule's order, so
  the prompts it ran, its stop and its violations are the serial run's. Requests past the stop
  are not sent; those already sent finish and are stored (so no other process sends them again),
  and may make the config's decoded prompts more than the serial run's: the decoder counts those
  no later decoding made items (``Decoder.past_stop``), and the spend reports them. An interruption (Ctrl-C, an error) cancels
  every request, closing its connection.

Configs go one after another, so they never share a server at once. Under xdist a process holds
the server's lease (``server:`` and the endpoint's URLs, in the outcome store) while it loads and
sends a config's requests, so the session as a whole keeps at most ``concurrency`` in flight on
a server, and one config at a time; the batches need no lease of their own. Every answer is stored as it arrives; one failed request loses
no other answer. The grid's ``timeout`` bounds each request.
"""
from __future__ import annotations

import asyncio
import atexit
import json
import time
import traceback
import weakref
from typing import Any, Sequence

from pytest_redline.schedule import CandidateRun
from pytest_redline.scoring import engine_prompts

# The decode stage passes itself in (a Decoder, its Batch class and its progress tracker);
# this module does not import it.
Decoder = Batch = _Progress = Any


def pipelined(decoder: "Decoder", config: str) -> bool:
    """Whether the config's engine is I/O-bound: its requests go through the pipeline."""
    from pytest_redline import registry

    name, _ = decoder.cal.engines[config]
    try:
        factory = registry.factory(registry.ENGINES, name)
    except Exception:  # reported where the engine is built
        return False
    return bool(getattr(factory, "io_bound", False)) and hasattr(factory, "complete")


class _Config:
    """One config's requests: its engine (built on the first request), its slots and its store."""

    def __init__(self, decoder: "Decoder", config: str, tracker: "_Progress") -> None:
        self.d, self.config, self.tracker = decoder, config, tracker
        self.engine_name, self.engine_args = decoder.cal.engines[config]
        self.params = decoder.cal.params[config]
        self.engine: Any = None
        self.slots: asyncio.Semaphore | None = None
        self.pending = 0  # prompts sent or queued, not answered yet
        self.server_lease: str | None = None
        self.bounds = None
        self.on_done = lambda: None
        self._ready: asyncio.Future | None = None
        self._leased: asyncio.Future | None = None
        self.in_flight: set[asyncio.Future] = set()  # requests sent, not answered yet
        self.decoded: set[int] = set()  # prompts answered and stored by this run
        self._preparing = asyncio.Lock()  # one batch prepared at a time (see batch)

    async def _engine(self) -> Any:
        """The engine, built by the first request."""
        if self._ready is None:
            self._ready = asyncio.ensure_future(self._build())
        return await asyncio.shield(self._ready)

    async def _build(self) -> Any:
        engine = self.d.engines.get(self.engine_name, self.engine_args)
        self.slots = asyncio.Semaphore(int(getattr(engine, "concurrency", 1)))
        self.bounds = self.d._bounds_of(self.config)
        self.engine = engine
        return engine

    async def _server(self) -> None:
        """The server's lease, before the config's first load: one process and one config at a
        time on a server, session-wide. Its holder alone loads and decodes the config's batches,
        so they need no lease of their own, and a load it makes is not stale."""
        if self._leased is None:
            self._leased = asyncio.ensure_future(self._take_server())
        await asyncio.shield(self._leased)

    async def _take_server(self) -> None:
        urls = self.engine_args.get("base_url", self.engine_name)
        lease = "server:" + json.dumps(sorted(map(str, [urls] if isinstance(urls, str) else urls)))
        while not self.d.store.take_lease(lease):
            await asyncio.sleep(self.d.poll_s)  # another process sends a config's requests to this server
        self.server_lease = lease

    def release(self) -> None:
        if self.server_lease is not None:
            self.d.store.release(self.server_lease)
            self.server_lease = None

    async def batch(self, batch: "Batch") -> None:
        """Load the batch, or decode its missing prompts under the server's lease.

        Batches are prepared (keys, the store's lookup, the engine) one at a time, and each one's
        requests are queued before the next is prepared: the first requests go out after one
        batch's preparation, and the rest is prepared while they are in flight."""
        d, config = self.d, self.config
        await self._server()
        async with self._preparing:
            if config in d._config_errors:
                return
            try:
                keys = d._keys(config, batch)
            except Exception as e:
                d._config_failed(config, e)
                return
            d._warn_shared_keys(config, keys)
            if d._load(config, batch, keys):
                self.tracker.step(len(batch.prompts), decoded=False)
                return
            try:
                await self._engine()
            except Exception as e:
                d._config_failed(config, e)
                return
            missing = [(i, k) for i, k in zip(batch.prompts, keys) if i not in d._outcomes[config]]
            prompts = engine_prompts(d.cal, [d.cal.prompts[i] for i, _ in missing])
            self.pending += len(missing)
            sent = [asyncio.ensure_future(self._prompt(i, k, p, batch)) for (i, k), p in zip(missing, prompts)]
        await asyncio.gather(*sent)  # cancelled, it cancels them
        self.tracker.step(len(batch.prompts), decoded=True)

    async def _prompt(self, index: int, key: str, prompt, batch: "Batch") -> None:
        """Wait for a slot, then send. A stop cancels a request still waiting; one already sent
        is shielded from it and finishes (its answer is stored), unless the run is interrupted."""
        try:
            try:
                engine = await self._engine()
            except Exception as e:
                self.d._config_failed(self.config, e)
                return
            async with self.slots:
                sent = asyncio.ensure_future(self._request(engine, index, key, prompt))
                self.in_flight.add(sent)
                sent.add_done_callback(self.in_flight.discard)
                await asyncio.shield(sent)
        finally:
            self.pending -= 1
            self.on_done()

    async def _request(self, engine: Any, index: int, key: str, prompt) -> None:
        d, config = self.d, self.config
        where = f"prompt {prompt.id!r} of config {config!r}"
        start = time.monotonic()
        try:
            generation = await asyncio.wait_for(engine.complete(prompt, self.params), d.cal.grid.timeout)
        except asyncio.TimeoutError:
            d._prompt_failed(config, index, f"engine {self.engine_name!r} timed out on {where}: timed out after "
                             f"{d.cal.grid.timeout:g} s (grid key timeout)", "")
            return
        except Exception as e:
            d._prompt_failed(config, index, f"engine {self.engine_name!r} failed on {where}: {type(e).__name__}: {e}",
                             traceback.format_exc())
            return
        finally:
            d.config_seconds[config] = d.config_seconds.get(config, 0.0) + time.monotonic() - start
        d._accept(config, index, key, d.cal.prompts[index], generation, self.engine_name, self.bounds)
        if index in d._outcomes[config]:
            self.decoded.add(index)


_loop: asyncio.AbstractEventLoop | None = None  # the process's pipeline loop: its connections outlive a config
_engines: "weakref.WeakSet[Any]" = weakref.WeakSet()  # engines with connections open on it


def _event_loop() -> asyncio.AbstractEventLoop:
    global _loop
    if _loop is None or _loop.is_closed():
        _loop = asyncio.new_event_loop()
    return _loop


@atexit.register
def shutdown() -> None:
    """Close every engine's connections and the pipeline's loop (the gate calls it at the end
    of the session)."""
    global _loop
    if _loop is None or _loop.is_closed():
        return
    try:
        for engine in list(_engines):
            if hasattr(engine, "aclose"):
                _loop.run_until_complete(engine.aclose())
    finally:
        _engines.clear()
        _loop.close()
        _loop = None


def _run(coroutine_of, run: _Config):
    """Run on the pipeline's loop, then cancel what was not sent and wait for what was (a stop),
    or cancel everything, closing its connections (an interruption: Ctrl-C, an error); hand the
    server back."""
    loop = _event_loop()
    tasks: list[asyncio.Future] = []
    interrupted = True
    try:
        result = loop.run_until_complete(coroutine_of(tasks))
        interrupted = False
        return result
    finally:
        run.on_done = lambda: None  # nothing more is sent
        try:
            for task in [*tasks, *(run.in_flight if interrupted else ())]:
                task.cancel()
            loop.run_until_complete(_drain(tasks, run))
        finally:
            if run.engine is not None:
                _engines.add(run.engine)
            run.release()
            if interrupted:  # Ctrl-C or an error: nothing is left open
                shutdown()


async def _drain(tasks: list, run: _Config) -> None:
    ready = [f for f in (run._ready, run._leased) if f is not None]
    await asyncio.gather(*tasks, *ready, *list(run.in_flight), return_exceptions=True)


def decode_batches(decoder: "Decoder", config: str, batches: Sequence["Batch"], tracker: "_Progress") -> None:
    """Every missing prompt of ``batches``, ``concurrency`` in flight, each stored as it arrives."""
    run = _Config(decoder, config, tracker)

    async def main(tasks: list) -> None:
        tasks.extend(asyncio.ensure_future(run.batch(b)) for b in batches)
        await asyncio.gather(*tasks)

    _run(main, run)


def scheduled_run(decoder: "Decoder", config: str, reference: Sequence[bool], regressed: set[int],
                  tracker: "_Progress", Batch: type) -> CandidateRun:
    """:meth:`Schedule.run`'s walk over the candidate's batches, with batches sent ahead
    (``Batch``: the decode stage's batch class)."""
    schedule, outcomes = decoder.schedule, decoder._outcomes[config]
    batches = schedule.visiting(reference, regressed)
    run = _Config(decoder, config, tracker)
    size = decoder.batch_size

    async def main(tasks: list) -> CandidateRun:
        current = [0]

        def fill() -> None:  # keep the pool full: batches ahead until twice the slots are pending
            slots = int(getattr(run.engine, "concurrency", size)) if run.engine is not None else size
            while len(tasks) < len(batches) and (len(tasks) <= current[0] or run.pending < 2 * slots):
                k = len(tasks)
                tasks.append(asyncio.ensure_future(run.batch(Batch(k + 1, batches[k]))))
                if run.engine is None:
                    break  # the first request builds the engine; it says how many slots to fill

        run.on_done = fill
        unknown = sum(len(b) for b in batches)
        violations, ran = 0, []
        for k, batch in enumerate(batches):
            stop = schedule.rule.decide(violations, unknown)
            if stop is not None and ran:
                return CandidateRun(tuple(ran), stop, violations, unknown)
            current[0] = k
            fill()
            await tasks[k]
            results = {i: outcomes[i].correct for i in batch if i in outcomes}
            ran += batch
            unknown -= sum(i in results for i in batch)
            violations += sum(results.get(i) is False for i in batch)
        return CandidateRun(tuple(ran), None, violations, unknown)

    result = _run(main, run)
    decoder._sent_ahead[config] = run.decoded - set(result.ran)  # past the stop: stored, not the config's items
    return result
