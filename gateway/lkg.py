"""A read-through cache that keeps serving its last-known-good values while the database is out.

Each entry is *fresh* for ``ttl_s`` after it was loaded; a request for a stale entry reloads it
(one database round trip, bounded by the store's deadline). When the reload fails because the
database cannot be reached (``StoreUnavailable``, at once while the store's ``DbHealth`` says
down), the entry is served as it was last read, for at most ``stale_max_s`` after that read::

    loaded ──ttl_s──▶ stale: reload ──ok──▶ loaded
                                   └─db out──▶ served as last read, until loaded + stale_max_s

Change events act on a tenant's entries without a database read: ``expire`` (reload on next
use, still servable during an outage: limits, prompts), ``distrust`` (reload on next use and
never served stale: a key revocation or a suspension the event could not spell out), ``drop``.
A load that overlaps an event is kept but marked stale, so it cannot hide the change.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from tenants.errors import StoreUnavailable


class OfTenant(Protocol):
    @property
    def tenant_id(self) -> str: ...


V = TypeVar("V", bound=OfTenant)


@dataclass
class Entry(Generic[V]):
    value: V
    loaded_at: float  # clock reading of the last successful database read
    fresh_until: float
    trusted: bool = True  # False: a change event arrived that no read has confirmed yet


class LastKnownGood(Generic[V]):
    def __init__(
        self, ttl_s: float, stale_max_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        assert ttl_s > 0 and stale_max_s >= 0, "bad cache lifetimes"
        self._ttl = ttl_s
        self._stale_max = stale_max_s
        self._clock = clock
        self._entries: dict[str, Entry[V]] = {}
        self._epoch = 0  # bumped by every event; a load spanning a bump is stored stale
        self.loads = 0  # database round trips attempted
        self.stale_served = 0  # answers given from last-known-good during an outage

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, key: str, load: Callable[[], Awaitable[V | None]]) -> V | None:
        """A fresh entry, else ``load()``; only found values are cached (a key or tenant
        created a moment ago is seen at once). ``StoreUnavailable`` passes when there is no
        trusted entry young enough to serve instead."""
        entry = self._entries.get(key)
        now = self._clock()
        if entry is not None and entry.trusted and now < entry.fresh_until:
            return entry.value
        self.loads += 1
        epoch = self._epoch
        try:
            value = await load()
        except StoreUnavailable:
            entry = self._entries.get(key)  # re-read: an event may have arrived meanwhile
            if (
                entry is not None
                and entry.trusted
                and self._clock() - entry.loaded_at <= (self._stale_max)
            ):
                self.stale_served += 1
                return entry.value
            raise
        if value is None:
            self._entries.pop(key, None)
            return None
        fresh_until = now + self._ttl if epoch == self._epoch else now
        self._entries[key] = Entry(value, now, fresh_until)
        return value

    def expire(self, tenant_id: str) -> None:
        self._epoch += 1
        for entry in self._entries.values():
            if entry.value.tenant_id == tenant_id:
                entry.fresh_until = entry.loaded_at

    def distrust(self, tenant_id: str) -> None:
        self._epoch += 1
        for entry in self._entries.values():
            if entry.value.tenant_id == tenant_id:
                entry.fresh_until = entry.loaded_at
                entry.trusted = False

    def drop(self, tenant_id: str) -> None:
        self._epoch += 1
        for key in [k for k, e in self._entries.items() if e.value.tenant_id == tenant_id]:
            del self._entries[key]

    def oldest_read_age(self) -> float | None:
        """Seconds since the oldest trusted entry was read (how stale answers may be)."""
        reads = [e.loaded_at for e in self._entries.values() if e.trusted]
        return self._clock() - min(reads) if reads else None

    def check_integrity(self, key_of: Callable[[V], str] | None = None) -> None:
        now = self._clock()
        for key, entry in self._entries.items():
            assert entry.loaded_at <= now, f"entry {key[:8]} read in the future"
            assert entry.loaded_at <= entry.fresh_until <= entry.loaded_at + self._ttl, (
                f"entry {key[:8]} fresh outside [read, read + ttl]"
            )
            if key_of is not None:
                assert key_of(entry.value) == key, f"entry {key[:8]} stored under another key"
