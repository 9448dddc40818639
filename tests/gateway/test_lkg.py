"""Last-known-good cache: fresh for the TTL, stale-but-served during a database outage for at
most the staleness bound, and change events that may refuse traffic are never answered stale."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gateway.lkg import LastKnownGood
from tenants.errors import StoreUnavailable


@dataclass(frozen=True)
class Row:
    tenant_id: str
    version: int


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Db:
    """The loader: answers from ``rows``, or raises ``StoreUnavailable`` while ``down``."""

    def __init__(self) -> None:
        self.rows: dict[str, Row] = {}
        self.down = False
        self.calls = 0

    def loader(self, key: str):  # type: ignore[no-untyped-def]
        async def load() -> Row | None:
            self.calls += 1
            if self.down:
                raise StoreUnavailable("down")
            return self.rows.get(key)

        return load


def make(ttl: float = 5.0, stale_max: float = 900.0) -> tuple[LastKnownGood[Row], Db, Clock]:
    clock = Clock()
    return LastKnownGood(ttl, stale_max, clock), Db(), clock


async def get(cache: LastKnownGood[Row], db: Db, key: str) -> Row | None:
    value = await cache.get(key, db.loader(key))
    cache.check_integrity(lambda r: r.tenant_id)
    return value


async def test_fresh_entries_need_no_database_and_stale_ones_reload() -> None:
    cache, db, clock = make()
    db.rows["a"] = Row("a", 1)
    assert await get(cache, db, "a") == Row("a", 1)
    db.rows["a"] = Row("a", 2)
    clock.now += 4.9
    assert await get(cache, db, "a") == Row("a", 1) and db.calls == 1
    clock.now += 0.2
    assert await get(cache, db, "a") == Row("a", 2) and db.calls == 2


async def test_unknown_values_are_not_cached() -> None:
    cache, db, _ = make()
    assert await get(cache, db, "a") is None
    db.rows["a"] = Row("a", 1)
    assert await get(cache, db, "a") == Row("a", 1)  # created a moment ago: seen at once
    assert len(cache) == 1


async def test_outage_serves_last_known_good_until_the_staleness_bound() -> None:
    cache, db, clock = make(ttl=5.0, stale_max=60.0)
    db.rows["a"] = Row("a", 1)
    await get(cache, db, "a")
    db.down = True
    clock.now += 30.0
    assert await get(cache, db, "a") == Row("a", 1)
    assert cache.stale_served == 1
    clock.now += 30.0  # exactly the bound after the last read: still served
    assert await get(cache, db, "a") == Row("a", 1)
    clock.now += 0.01
    with pytest.raises(StoreUnavailable):
        await get(cache, db, "a")
    with pytest.raises(StoreUnavailable):  # never seen: nothing to fall back on
        await get(cache, db, "b")
    db.down = False
    assert await get(cache, db, "a") == Row("a", 1)
    assert cache.oldest_read_age() == 0.0


async def test_distrusted_entries_are_never_served_stale() -> None:
    cache, db, _ = make()
    db.rows["a"] = Row("a", 1)
    db.rows["b"] = Row("b", 1)
    await get(cache, db, "a")
    await get(cache, db, "b")
    cache.distrust("a")  # e.g. a key revocation announced while the database is out
    db.down = True
    with pytest.raises(StoreUnavailable):
        await get(cache, db, "a")
    assert await get(cache, db, "b") == Row("b", 1)  # other tenants unaffected
    db.down = False
    db.rows["a"] = Row("a", 2)
    assert await get(cache, db, "a") == Row("a", 2)  # a read makes it trusted again
    db.down = True
    assert await get(cache, db, "a") == Row("a", 2)


async def test_expired_entries_reload_but_stay_servable_and_dropped_ones_are_gone() -> None:
    cache, db, _ = make()
    db.rows["a"] = Row("a", 1)
    await get(cache, db, "a")
    cache.expire("a")
    db.rows["a"] = Row("a", 2)
    assert await get(cache, db, "a") == Row("a", 2)  # reloaded at once, TTL not waited
    cache.expire("a")
    db.down = True
    assert await get(cache, db, "a") == Row("a", 2)  # a limit change: stale is fine
    cache.drop("a")
    with pytest.raises(StoreUnavailable):
        await get(cache, db, "a")


async def test_a_load_overlapping_an_event_is_stored_stale() -> None:
    cache, db, _ = make()
    db.rows["a"] = Row("a", 1)

    async def load_then_event() -> Row | None:
        row = db.rows["a"]  # read before the change commits ...
        cache.expire("a")  # ... whose event arrives while this load is in flight
        return row

    assert await cache.get("a", load_then_event) == Row("a", 1)
    db.rows["a"] = Row("a", 2)
    assert await get(cache, db, "a") == Row("a", 2)  # not served from the overlapped load
