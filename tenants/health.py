"""Whether the tenant database answers, and the fail-fast rule while it does not.

A unit of work that fails because the database cannot be reached marks it down. While it is
down, at most one unit of work per ``retry_s`` is let through to try it (it waits at most the
store's deadline); every other one fails at once with ``StoreUnavailable``, so callers that have
a fallback (the key cache's last-known-good entries) answer without waiting on the database.
The first unit of work that succeeds marks it up again.

    up ──failure──▶ down ──(retry_s passed) one trial──▶ up (success) | down (failure)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class HealthSnapshot:
    up: bool
    down_for_s: float | None  # seconds since the first failure of the current outage
    last_error: str | None  # exception class name only (messages may carry connection details)


class DbHealth:
    def __init__(self, retry_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        """``retry_s = 0``: track the state only, never fail fast (the CLI, tests)."""
        assert retry_s >= 0, "retry interval must be >= 0"
        self.retry_s = retry_s
        self._clock = clock
        self._down_since: float | None = None
        self._next_try = 0.0
        self._last_error: str | None = None

    @property
    def up(self) -> bool:
        return self._down_since is None

    def admit(self) -> bool:
        """May a unit of work try the database now? Always while up; while down, one caller
        per retry interval (the trial), the others are told to fail at once."""
        if self._down_since is None or self.retry_s == 0:
            return True
        now = self._clock()
        if now < self._next_try:
            return False
        self._next_try = now + self.retry_s
        return True

    def succeeded(self) -> None:
        if self._down_since is not None:
            log.info("tenant_database_up", down_for_s=round(self._clock() - self._down_since, 3))
        self._down_since = None
        self._last_error = None

    def failed(self, exc: BaseException) -> None:
        now = self._clock()
        self._last_error = type(exc.__cause__ or exc).__name__
        self._next_try = now + self.retry_s
        if self._down_since is None:
            self._down_since = now
            log.warning("tenant_database_down", error=self._last_error)

    def snapshot(self) -> HealthSnapshot:
        if self._down_since is None:
            return HealthSnapshot(True, None, None)
        return HealthSnapshot(False, self._clock() - self._down_since, self._last_error)

    def check_integrity(self) -> None:
        if self._down_since is None:
            assert self._last_error is None, "an error is recorded while the database is up"
        else:
            assert self._down_since <= self._clock(), "outage starts in the future"
            assert self._next_try >= self._down_since, "next trial before the outage began"
