"""A circuit breaker per tool (gateway/chat/tools/run/runner.py keys it by tenant, source and tool
name: one MCP server's or one webhook URL's tools each have their own).

    closed     calls go through; ``failures`` failures in a row open it
    open       calls are answered at once ("circuit open") for ``reset_s``
    half-open  after ``reset_s`` one trial call goes through: success closes, failure reopens;
               a trial that ends without a verdict (``release``) lets the next call try

A failure is the endpoint failing (``Endpoint.DOWN``: no connection, no answer in time, a 5xx),
never the tool refusing a call: visitors choose the arguments, and a tool that rejects bad ones
is working. Keys include the tenant, so one tenant's failing endpoint never opens another
tenant's circuit (even for the same URL). The clock is injected (tests use their own).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Circuit:
    failures: int = 0
    opened_at: float | None = None
    trial: bool = False  # a half-open trial is in flight


class Breakers:
    def __init__(
        self, failures: int, reset_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._threshold = failures
        self._reset_s = reset_s
        self._clock = clock
        self._circuits: dict[str, _Circuit] = {}

    def admit(self, key: str) -> bool:
        """Whether a call to ``key`` may go out now (a half-open circuit admits one)."""
        c = self._circuits.get(key)
        if c is None or c.opened_at is None:
            return True
        if c.trial or self._clock() - c.opened_at < self._reset_s:
            return False
        c.trial = True
        return True

    def record(self, key: str, ok: bool) -> None:
        c = self._circuits.setdefault(key, _Circuit())
        c.trial = False
        if ok:
            self._circuits.pop(key, None)
            return
        c.failures += 1
        if c.failures >= self._threshold or c.opened_at is not None:
            c.opened_at = self._clock()

    def release(self, key: str) -> None:
        """The admitted call ended with no verdict on the endpoint (nothing was sent, or it was
        cancelled): a half-open circuit admits its next call as the trial."""
        c = self._circuits.get(key)
        if c is not None:
            c.trial = False

    def is_open(self, key: str) -> bool:
        c = self._circuits.get(key)
        return c is not None and c.opened_at is not None

    def check_integrity(self) -> None:
        for key, c in self._circuits.items():
            assert c.failures >= 1, f"{key}: a closed circuit without failures is kept"
            assert not c.trial or c.opened_at is not None, f"{key}: a trial while closed"
