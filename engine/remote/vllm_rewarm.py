"""When a prompt kept warm on a vLLM server is warmed again (vLLM has no pin).

The server's KV events say a kept prompt lost blocks; sending it again is a prefill that queues
in front of real requests on a busy server, and when the server's cache cannot hold what is
kept it is evicted again by the next requests (thrash). So a prompt is warmed again only when:

    its tenant had a request on this server within ``recent_s`` (a cold tenant's next request
        computes its prompt, as without a placement; ``KVGATE_VLLM_REWARM_RECENT_S``, 0: never)
    the prompts kept there fit the server's cache together (else none is warmed again)
    the server has no request of this gateway in flight (a re-warm never waits in front of
        one; one due while busy is done when the server is idle, if still due then)
    no other re-warm is in flight on it (one at a time)

and it is sent with vLLM's lowest priority where the server schedules by priority.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

import structlog

from engine.errors import EngineError

log = structlog.get_logger(__name__)
RECENT_S = 30.0  # a tenant with no request for longer is not warmed again


@dataclass(frozen=True)
class Kept:
    """A prompt kept warm: its tenant's namespace and its blocks on the server."""

    namespace: str
    blocks: int


class Rewarmer:
    """The re-warms of one server, one at a time. ``warm(pin_id)`` sends one; ``busy()``: the
    server has requests of this gateway in flight; ``kept()``: the prompts kept there by pin id
    and the server's cache capacity in blocks."""

    def __init__(
        self,
        warm: Callable[[int], Awaitable[None]],
        busy: Callable[[], bool],
        kept: Callable[[], tuple[Mapping[int, Kept], int]],
        *,
        recent_s: float = RECENT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._warm = warm
        self._busy = busy
        self._kept = kept
        self._recent_s = recent_s
        self._clock = clock
        self._last_used: dict[str, float] = {}  # namespace -> its latest request here
        self._due: dict[int, None] = {}  # pin ids whose blocks left, oldest first
        self._task: asyncio.Task[None] | None = None
        self.done = 0  # re-warms sent
        self.skipped = 0  # due ones dropped: tenant not recent, or the kept set cannot fit

    def used(self, namespace: str) -> None:
        self._last_used[namespace] = self._clock()

    def recent(self, namespace: str) -> bool:
        at = self._last_used.get(namespace)
        return at is not None and self._recent_s > 0 and self._clock() - at <= self._recent_s

    def mark(self, pin_ids: Iterable[int]) -> None:
        for pin_id in pin_ids:
            self._due.setdefault(pin_id, None)

    def kick(self) -> None:
        """Start the due re-warms if the server allows them now (call when it may)."""
        running = self._task is not None and not self._task.done()
        if not running and self._due and not self._busy():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def next_due(self) -> int | None:
        """The pin to warm again now, if any; drops due ones that are no longer worth it."""
        if self._busy() or not self._due:
            return None
        kept, capacity_blocks = self._kept()
        fits = sum(k.blocks for k in kept.values()) <= capacity_blocks
        for pin_id in list(self._due):
            del self._due[pin_id]
            prompt = kept.get(pin_id)
            if prompt is None:
                continue  # unpinned meanwhile
            if fits and self.recent(prompt.namespace):
                return pin_id
            self.skipped += 1
        return None

    async def _run(self) -> None:
        while (pin_id := self.next_due()) is not None:
            self.done += 1
            try:
                await self._warm(pin_id)
            except EngineError as exc:  # the next request of the tenant computes it
                log.info("vllm_rewarm_failed", error=type(exc).__name__)

    async def idle(self) -> None:
        """Wait for the re-warm in flight, if any."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def close(self) -> None:
        self._due.clear()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
