"""What the ``openai`` engine retries, how long it waits, and the error of a prompt that fails for good.

A fault is anything that is not an answer. :class:`Fault` is one failed attempt: ``retried``
says whether another attempt may succeed, ``status`` is the HTTP status (None: no response),
and ``retry_after`` the seconds a server asked to wait. Retried: connection errors and drops
(a stream that ends before its last event), timeouts, 408/409/425/429/5xx, malformed JSON, an
empty ``choices`` list, a choice with no text, and a ``finish_reason: length`` whose reported
``usage.completion_tokens`` is below ``max_tokens``. Any other 4xx is not retried.
"""
from __future__ import annotations

import email.utils
import random
import time

RETRIED_STATUS = frozenset({408, 409, 425, 429})


class Fault(Exception):
    """One failed attempt of one request."""

    def __init__(self, message: str, retried: bool, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retried, self.status, self.retry_after = retried, status, retry_after


class RequestFailed(RuntimeError):
    """A prompt that failed for good: every attempt ended in a fault (``attempts`` counts them),
    or the first was not worth retrying. ``last`` is the last attempt's :class:`Fault`."""

    def __init__(self, prompt_id: str, attempts: int, last: Fault, label: str) -> None:
        times = "attempt" if attempts == 1 else "attempts"
        super().__init__(f"openai endpoint {label!r}: prompt {prompt_id!r} failed for good after {attempts} {times}: {last}")
        self.prompt_id, self.attempts, self.last = prompt_id, attempts, last

    @property
    def status(self) -> int | None:
        return self.last.status

    def __reduce__(self):  # pickles (xdist) with its fields
        return _rebuild, (str(self), self.prompt_id, self.attempts, str(self.last), self.last.retried, self.last.status)


def _rebuild(message: str, prompt_id: str, attempts: int, last: str, retried: bool, status: int | None) -> RequestFailed:
    error = RequestFailed.__new__(RequestFailed)
    RuntimeError.__init__(error, message)
    error.prompt_id, error.attempts, error.last = prompt_id, attempts, Fault(last, retried, status)
    return error


def status_fault(status: int, body: str, retry_after: str | None) -> Fault:
    """The fault of an HTTP error response."""
    retried = status in RETRIED_STATUS or status >= 500
    return Fault(f"HTTP {status}: {body[:300]}", retried, status, parse_retry_after(retry_after))


def parse_retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds: a number of seconds or an HTTP date (None: absent or unreadable)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class Backoff:
    """The wait before retry ``k`` (1-based): ``base * 2 ** (k - 1)`` scaled by a random factor in
    [0.5, 1] (jitter, so that requests failed together do not return together), and at least the
    server's ``Retry-After`` up to ``cap`` seconds."""

    def __init__(self, base: float, cap: float, rng: random.Random | None = None) -> None:
        self.base, self.cap, self.rng = base, cap, rng or random.Random()

    def wait(self, retry: int, fault: Fault) -> float:
        delay = self.base * 2 ** (retry - 1) * self.rng.uniform(0.5, 1.0)
        if fault.retry_after is not None:
            delay = max(delay, min(fault.retry_after, self.cap))
        return min(delay, max(self.cap, self.base))
