"""A read-through cache that keeps serving its last-known-good values while the database is out.

Each entry is *fresh* for ``ttl_s`` after it was loaded; a request for a stale entry reloads it
(one database round trip, bounded by the store's deadline). When the reload fails because the
database cannot be reached (``StoreUnavailable``, at once while the store's ``DbHealth`` says
down), the entry is served as it was last read, for at most ``stale_max_s`` after that read::

    loaded ──ttl_s──▶ stale: reload ──ok──▶ loaded
                                   └─db out──▶ served as last read, until loaded + stale_max_s

Change events act on entries without a database read. By tenant: ``expire`` (reload on next use,
still servable during an outage: limits, prompts), ``distrust`` (reload on next use and never
served stale: a change that may refuse traffic and that the event does not spell out), ``drop``.
By value: ``revise`` (apply a change the event spells out, e.g. a new status, then reload on next
use; the revised value is what an outage serves), ``expire_where``, and ``revoke_where`` /
``revoke`` (a permanent refusal: the entry is gone and its key answers None without a read,
during an outage too). A load that overlaps an event of its tenant is kept but stale and
untrusted, so it can neither hide the change nor be served in its place.

A read that finds nothing is remembered for ``miss_ttl_s`` (``gateway/access/misses.py``: bounded,
forgotten by the events that may make it a hit, ``forget_missing``), so a burst of one unknown
key costs one read. Concurrent reads of one key share one database round trip (started in a
task of its own, so a caller that goes away does not fail the others); a caller joins a read
only if no event arrived since it started.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from gateway.access.misses import RecentMisses
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


@dataclass(frozen=True)
class _Flight(Generic[V]):
    epoch: int  # the event epoch the read started in: later callers join only within it
    task: asyncio.Task[V | None]


class LastKnownGood(Generic[V]):
    def __init__(
        self,
        ttl_s: float,
        stale_max_s: float,
        clock: Callable[[], float] = time.monotonic,
        max_revoked: int = 10_000,
        miss_ttl_s: float = 1.0,
        max_misses: int = 10_000,
    ) -> None:
        assert ttl_s > 0 and stale_max_s >= 0, "bad cache lifetimes"
        self._ttl = ttl_s
        self._stale_max = stale_max_s
        self._clock = clock
        self._entries: dict[str, Entry[V]] = {}
        # Keys refused for good (revoked API keys), oldest first; beyond ``max_revoked`` the
        # oldest are forgotten (then the database answers for them again).
        self._revoked: OrderedDict[str, None] = OrderedDict()
        self._max_revoked = max_revoked
        self._epoch = 0  # bumped by every event
        self._touched: dict[str, int] = {}  # tenant id -> epoch of its latest event
        self._misses = RecentMisses(miss_ttl_s, max_misses)
        self._flights: dict[str, _Flight[V]] = {}  # key -> the read in progress
        self.loads = 0  # database round trips attempted
        self.stale_served = 0  # answers given from last-known-good during an outage
        self.misses_served = 0  # None answered from a recent miss, without a read

    def __len__(self) -> int:
        return len(self._entries)

    async def get(
        self, key: str, load: Callable[[], Awaitable[V | None]], *, refresh: bool = False
    ) -> V | None:
        """A fresh entry or a recent miss, else ``load()`` (shared with a read of the same key
        already running); ``refresh``: read even so. A key or tenant created a moment ago is
        seen at once unless this key was read missing less than ``miss_ttl_s`` ago and no event
        made it known since. ``StoreUnavailable`` passes when there is no trusted entry young
        enough to serve instead. A revoked key is None, with no read."""
        if key in self._revoked:
            return None
        now = self._clock()
        if not refresh:
            entry = self._entries.get(key)
            if entry is not None and entry.trusted and now < entry.fresh_until:
                return entry.value
            if self._misses.missing(key, now):
                self.misses_served += 1
                return None
        flight = self._flights.get(key)
        if flight is None or flight.epoch != self._epoch:
            flight = _Flight(self._epoch, asyncio.ensure_future(self._load(key, load, now)))
            self._flights[key] = flight
            flight.task.add_done_callback(functools.partial(self._landed, key, flight))
        return await asyncio.shield(flight.task)

    def _landed(self, key: str, flight: _Flight[V], _: object) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]
        if not flight.task.cancelled():
            flight.task.exception()  # retrieved here too: every caller may have gone away

    async def _load(
        self, key: str, load: Callable[[], Awaitable[V | None]], now: float
    ) -> V | None:
        self.loads += 1
        epoch, misses = self._epoch, self._misses.generation
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
        if value is None or key in self._revoked:
            self._entries.pop(key, None)
            if value is None:
                self._misses.add(key, now, misses)
            return None
        self._misses.discard(key)  # found after all (a refresh, or a miss that expired)
        if self._touched.get(value.tenant_id, 0) > epoch:  # an event of its tenant overlapped
            self._entries[key] = Entry(value, now, now, trusted=False)
        else:
            self._entries[key] = Entry(value, now, now + self._ttl)
        return value

    def forget_missing(self, key: str | None = None) -> None:
        """Read ``key`` (None: every key) again even if it was just found missing: an event
        says it may exist now (a key or tenant created, a tenant restored)."""
        self._misses.forget(key)

    def _event(self, tenant_id: str) -> None:
        self._epoch += 1
        self._touched[tenant_id] = self._epoch

    def _of(self, tenant_id: str) -> list[Entry[V]]:
        return [e for e in self._entries.values() if e.value.tenant_id == tenant_id]

    def expire(self, tenant_id: str) -> None:
        self._event(tenant_id)
        for entry in self._of(tenant_id):
            entry.fresh_until = entry.loaded_at

    def distrust(self, tenant_id: str) -> None:
        self._event(tenant_id)
        for entry in self._of(tenant_id):
            entry.fresh_until = entry.loaded_at
            entry.trusted = False

    def drop(self, tenant_id: str) -> None:
        self._event(tenant_id)
        for key in [k for k, e in self._entries.items() if e.value.tenant_id == tenant_id]:
            del self._entries[key]

    def revise(self, tenant_id: str, change: Callable[[V], V]) -> None:
        """Apply a change an event spelled out to the tenant's entries, and reload them on
        next use; during an outage the revised value is served."""
        self._event(tenant_id)
        for entry in self._of(tenant_id):
            entry.value = change(entry.value)
            assert entry.value.tenant_id == tenant_id, "a revision moved an entry to a tenant"
            entry.fresh_until = entry.loaded_at

    def expire_where(self, tenant_id: str, match: Callable[[V], bool]) -> None:
        """Reload the tenant's matching entries on next use (still servable in an outage)."""
        self._event(tenant_id)
        for entry in self._of(tenant_id):
            if match(entry.value):
                entry.fresh_until = entry.loaded_at

    def revoke_where(self, tenant_id: str, match: Callable[[V], bool]) -> None:
        """Refuse the tenant's matching entries for good: their keys answer None, no read."""
        self._event(tenant_id)
        for key in [k for k, e in self._entries.items() if e.value.tenant_id == tenant_id]:
            if match(self._entries[key].value):
                self.revoke(key)

    def revoke(self, key: str) -> None:
        """Refuse ``key`` for good, cached or not (the caller knows the refusal is permanent)."""
        self._entries.pop(key, None)
        self._misses.forget(key)
        self._revoked[key] = None
        self._revoked.move_to_end(key)
        while len(self._revoked) > self._max_revoked:
            self._revoked.popitem(last=False)

    def oldest_read_age(self) -> float | None:
        """Seconds since the oldest trusted entry was read (how stale answers may be)."""
        reads = [e.loaded_at for e in self._entries.values() if e.trusted]
        return self._clock() - min(reads) if reads else None

    def check_integrity(self, key_of: Callable[[V], str] | None = None) -> None:
        now = self._clock()
        assert len(self._revoked) <= self._max_revoked, "too many revoked keys remembered"
        assert max(self._touched.values(), default=0) <= self._epoch, "event after the epoch"
        self._misses.check_integrity(now)
        for key, entry in self._entries.items():
            assert key not in self._revoked, f"entry {key[:8]} is revoked yet cached"
            assert not self._misses.missing(key, now), f"entry {key[:8]} cached and missing"
            assert entry.loaded_at <= now, f"entry {key[:8]} read in the future"
            assert entry.loaded_at <= entry.fresh_until <= entry.loaded_at + self._ttl, (
                f"entry {key[:8]} fresh outside [read, read + ttl]"
            )
            if key_of is not None:
                assert key_of(entry.value) == key, f"entry {key[:8]} stored under another key"
