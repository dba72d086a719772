"""What an item of the decode stage gets besides an outcome: :class:`DecodeError` (no outcome) or
:class:`Skipped` (the schedule skips it on purpose), and the :class:`Batch` a config decodes."""
from __future__ import annotations

from dataclasses import dataclass

from pytest_redline.decode.store import StoredOutcome
from pytest_redline.schedule import EARLY_STOP, REFERENCE_WRONG


class DecodeError(Exception):
    """No outcome for a prompt: the engine raised or timed out, or the scorer crashed.

    ``short`` is a one-line summary, for items that point to where the error was reported
    in full.
    """

    def __init__(self, message: str, details: str = "", short: str | None = None) -> None:
        super().__init__(message)
        self.message, self.details, self.short = message, details, short or message.splitlines()[0]

    def explain(self, verbose: bool) -> str:
        return f"{self.message}\n{self.details}" if verbose and self.details else self.message


class Skipped(Exception):
    """The schedule skips this item on purpose: its outcome cannot change the verdict.

    ``reason`` is :data:`~pytest_redline.schedule.REFERENCE_WRONG`, ``CANNOT`` or
    ``CERTAIN``; ``recorded`` is the outcome a replayed grid has anyway (None when live).
    """

    def __init__(self, reason: str, recorded: StoredOutcome | None = None) -> None:
        self.reason, self.recorded = reason, recorded
        super().__init__(self.message)

    @property
    def message(self) -> str:
        if self.reason == REFERENCE_WRONG:
            return f"redline: {REFERENCE_WRONG}"
        return f"redline: {EARLY_STOP} ({self.reason})"


@dataclass(frozen=True)
class Batch:
    """Prompts decoded in one ``engine.generate`` call (indices in prompt order)."""

    number: int  # 1-based, among the config's batches
    prompts: tuple[int, ...]
