"""Progress lines while a config decodes."""
from __future__ import annotations

import time
from typing import Any



PROGRESS_EVERY_S = 5.0  # at most this long without a progress line while decoding (plus one batch)


class Progress:
    """Progress lines while a config decodes: one per batch at most every PROGRESS_EVERY_S, and
    a last one if any was shown or the decode took that long. Quick or cached configs stay quiet."""

    def __init__(self, decoder: Any, config: str, prompts: int, batches: int, what: str = "prompts") -> None:
        self.decoder, self.config, self.prompts, self.batches = decoder, config, prompts, batches
        self.what = what  # what the denominator counts: a scheduled candidate's are the reference-correct prompts
        self.done = self.decoded = self.prompts_done = self.shown = 0
        self.start = self.last = time.monotonic()

    def step(self, prompts: int, decoded: bool) -> None:
        self.done += 1
        self.prompts_done += prompts
        self.decoded += decoded
        now = time.monotonic()
        if decoded and now - self.last >= PROGRESS_EVERY_S and self.done < self.batches:
            self.emit(now)

    def finish(self, note: str = "") -> None:
        now = time.monotonic()
        if self.decoded and (self.shown or now - self.start >= PROGRESS_EVERY_S):
            self.emit(now, note)

    def emit(self, now: float, note: str = "") -> None:
        d = self.decoder
        self.last = now
        self.shown += 1
        d.progress(
            f"redline {d.cal.grid.name} {self.config}: {self.prompts_done}/{self.prompts} {self.what}, "
            f"batch {self.done}/{self.batches} ({self.decoded} decoded), {now - self.start:.1f} s{note}"
        )
