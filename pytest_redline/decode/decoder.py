"""The decode stage of one grid: :class:`Decoder`, made of its jobs (plan, storage, calls)."""
from __future__ import annotations

from typing import Callable, Iterable

from pytest_redline.calibration import Calibration
from pytest_redline.decode.batchrun import BatchRunner
from pytest_redline.decode.calls import Calls
from pytest_redline.decode.enginebook import EngineBook
from pytest_redline.decode.items import Batch, DecodeError, Skipped
from pytest_redline.decode.plan import Planner
from pytest_redline.decode.storage import Storage
from pytest_redline.decode.store import OutcomeStore, StoredOutcome
from pytest_redline.content import CONTENT_HASHES, ContentHashes
from pytest_redline.keys import OutcomeKeys, scorer_name
from pytest_redline.schedule import REFERENCE_WRONG, CandidateRun, Schedule
from pytest_redline.scoring import scoring_version


class Decoder(Planner, Storage, Calls):
    """One grid's outcomes in one process: from the store when it has them, else from the engine."""

    def __init__(
        self,
        cal: Calibration,
        store: OutcomeStore,
        engines: EngineBook,
        session: str,
        progress: Callable[[str], None] = lambda line: None,
        poll_s: float = 0.2,
    ) -> None:
        self.cal, self.store, self.engines, self.session = cal, store, engines, session
        if engines.cache_dir is None:  # engines keep their weight hashes beside the store
            engines.cache_dir = store.path.parent
        self.progress, self.poll_s = progress, poll_s
        self.batch_size = cal.grid.batch_size
        self.runner = BatchRunner(cal.grid.timeout)
        self.schedule = None if cal.full else Schedule(cal.n, self.batch_size, cal.seed, cal.stop_rule(), adaptive=True)
        self.fallback: str | None = None  # why this grid runs in full although scheduling was asked for
        self.config_seconds: dict[str, float] = {}  # wall time spent in engine.generate, per config
        self.past_stop: dict[str, int] = {}  # per config: prompts decoded past its early stop that are not its items
        self._sent_ahead: dict[str, set[int]] = {}  # per config: prompts the pipeline decoded past its early stop
        self._planned: set[tuple[str, int]] = set()
        self._needed: dict[str, set[int]] = {name: set() for name in cal.configs}
        self._outcomes: dict[str, dict[int, StoredOutcome]] = {name: {} for name in cal.configs}
        self._errors: dict[tuple[str, int], DecodeError] = {}
        self._config_errors: dict[str, DecodeError] = {}
        self._started: set[str] = set()
        self._scheduled: bool | None = None
        self._reference: list[bool | None] | None = None
        self._key_owner: dict[str, str] = {}  # outcome key -> the first config that used it
        self._shared: set[tuple[str, str]] = set()
        self._runs: dict[str, CandidateRun | None] = {}
        self._ran: dict[str, set[int]] = {}
        self._recorded: dict[str, dict[int, StoredOutcome]] = {}
        self._bounds: dict[str, dict | None] = {}
        self._interval_memo: dict[str, tuple[int, tuple]] = {}
        self.decided: dict[str, dict[str, str]] = {}  # valid candidates not decoded everywhere: why, and their cost interval
        self.keys = OutcomeKeys(cal, engines, ContentHashes(store.path.parent / CONTENT_HASHES))
        self.scoring = scoring_version(cal, scorer_name(cal))
        self.rescored = 0  # stored outcomes judged again because the scoring changed

    # ------------------------------------------------------------------ public

    def need(self, config: str, index: int) -> None:
        """Plan: the session needs ``config``'s outcome on prompt ``index`` (and the reference's)."""
        self._planned.add((config, index))
        self._needed[config].add(index)
        self._needed[self.cal.reference].add(index)

    def outcome(self, config: str, index: int) -> StoredOutcome:
        """The outcome of ``config`` on prompt ``index``.

        Raises :class:`DecodeError` when it has none, and :class:`Skipped` when the
        schedule skips it on purpose.
        """
        if config != self.cal.reference and self.scheduled:
            run = self._run(config)
            if run is not None:
                if index in self._ran[config]:
                    return self._result(config, index)
                reason = REFERENCE_WRONG if not self._reference_correct()[index] else run.stop
                raise Skipped(reason, self._recorded_outcome(config, index) if self.cal.replayed else None)
        if config not in self._started:
            self._started.add(config)
            self._get(config, self._batches_of(self._needed[config]))
            self._ahead(config)
        if index not in self._outcomes[config] and (config, index) not in self._errors:
            self._get(config, self._batches_of([index]))  # not planned (no collection hook ran)
        return self._result(config, index)

    def ready(self, config: str, index: int) -> bool:
        """Whether :meth:`outcome` would answer from memory: an outcome decoded or loaded
        earlier in this session, or a skip the schedule already decided. False when it would
        read the store, run the engine (or the replay of a skipped prompt) or raise an error."""
        if config in self._config_errors or (config, index) in self._errors:
            return False
        if config != self.cal.reference and self.scheduled:
            if not self._runs:
                return False
            run = self._runs[config]
            if run is not None:
                if index not in self._ran[config]:
                    return not self.cal.replayed or config in self._recorded
                return index in self._outcomes[config]
        return config in self._started and index in self._outcomes[config]

    @property
    def scheduled(self) -> bool:
        """Whether candidates follow the schedule: not --redline-full, and every item selected."""
        if self._scheduled is None:
            total = self.cal.m * self.cal.n
            if self.schedule is not None and len(self._planned) < total:
                self.fallback = f"{total - len(self._planned)} of {total} items not selected"
            self._scheduled = self.schedule is not None and self.fallback is None
        return self._scheduled

    # ------------------------------------------------------------------ the schedule

    def _result(self, config: str, index: int) -> StoredOutcome:
        if config in self._config_errors:
            raise self._config_errors[config]
        if (config, index) in self._errors:
            raise self._errors[(config, index)]
        return self._outcomes[config][index]

    def _batches_of(self, indices: Iterable[int]) -> list[Batch]:
        """The fixed prompt-order batches holding ``indices`` (the full run's batches)."""
        size, n = self.batch_size, self.cal.n
        return [Batch(b + 1, tuple(range(b * size, min(n, (b + 1) * size)))) for b in sorted({i // size for i in indices})]
