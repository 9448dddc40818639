"""KV events of one worker: blocks stored / removed / moved between tiers, streamed to subscribers.

The prefix cache calls the listener on the engine thread; events are buffered under a lock and
handed to the event loop in batches (``drain``), so the engine thread never touches asyncio::

    engine thread: on_stored / on_removed -> _pending (lock)
    event loop:    every interval: drain -> each subscriber's bounded queue (a slow subscriber
                   loses its queue and must resubscribe: it then gets a fresh snapshot marker)

Namespaces are sent as their root key digest, never as the salt itself. A removed event names
only the block key (the cache knows no more); subscribers keep key -> namespace themselves.
Events (engine/remote/messages.py)::

    Stored(namespace, key, parent | None)   stored on the device
    Removed(key)                            removed from the device
    Tiered(key, "host" | "device" | None)   tier: copied out to host memory (the device block
                                            may stay until evicted), restored to the device,
                                            or dropped from host memory (None)

A block offloaded on eviction sends "t" host, then "r": the worker still holds it, in host memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

from engine.core.kv.hashing import root_key
from engine.core.kv.types import TIERS, Tier
from engine.remote.messages import KvEvent, Removed, Stored, Tiered

QUEUE_LIMIT = 10_000  # batches a subscriber may fall behind before it is dropped


class KvEventHub:
    """A ``CacheListener`` that fans the cache's events out to asyncio subscribers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[KvEvent] = []
        self._subscribers: set[asyncio.Queue[list[KvEvent] | None]] = set()
        self.stored = 0  # events seen (tests)
        self.removed = 0
        self.tiered = 0

    # -- engine thread -------------------------------------------------------------------------
    def on_stored(
        self, namespace: str, key: bytes, parent_key: bytes | None, token_ids: tuple[int, ...]
    ) -> None:
        ns = root_key(namespace).hex()
        event = Stored(ns, key.hex(), parent_key.hex() if parent_key else None)
        with self._lock:
            self.stored += 1
            if self._subscribers:
                self._pending.append(event)

    def on_removed(self, key: bytes) -> None:
        with self._lock:
            self.removed += 1
            if self._subscribers:
                self._pending.append(Removed(key.hex()))

    def on_tier(self, key: bytes, tier: Tier | None) -> None:
        assert tier is None or tier in TIERS, f"unknown tier {tier!r}"
        with self._lock:
            self.tiered += 1
            if self._subscribers:
                self._pending.append(Tiered(key.hex(), tier))

    # -- event loop ----------------------------------------------------------------------------
    def subscribe(self) -> asyncio.Queue[list[KvEvent] | None]:
        q: asyncio.Queue[list[KvEvent] | None] = asyncio.Queue(QUEUE_LIMIT)
        with self._lock:
            self._subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[list[KvEvent] | None]) -> None:
        with self._lock:
            self._subscribers.discard(q)

    def drain(self) -> int:
        """Hand buffered events to every subscriber; returns how many events were sent."""
        with self._lock:
            batch, self._pending = self._pending, []
            subscribers = list(self._subscribers)
        if not batch:
            return 0
        for q in subscribers:
            try:
                q.put_nowait(batch)
            except asyncio.QueueFull:  # too slow: cut off (None ends its stream)
                self.unsubscribe(q)
                with contextlib.suppress(asyncio.QueueEmpty):
                    q.get_nowait()
                q.put_nowait(None)
        return len(batch)

    async def run(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.drain()
