"""Last-known-good cache: fresh for the TTL, stale-but-served during a database outage for at
most the staleness bound, and change events that may refuse traffic are never answered stale."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from gateway.access.lkg import LastKnownGood
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


async def test_unknown_values_are_remembered_briefly_until_an_event_says_otherwise() -> None:
    cache, db, clock = make()
    for _ in range(100):
        assert await get(cache, db, "a") is None
    assert (db.calls, cache.misses_served) == (1, 99)  # one read for the whole burst
    db.rows["a"] = Row("a", 1)
    clock.now += 0.9
    assert await get(cache, db, "a") is None and db.calls == 1  # within the miss TTL (1 s)
    clock.now += 0.1
    assert await get(cache, db, "a") == Row("a", 1)  # created on a replica whose event was lost
    assert len(cache) == 1
    assert await get(cache, db, "b") is None
    db.rows["b"] = Row("b", 1)
    cache.forget_missing("b")  # the event that created it: seen at once
    assert await get(cache, db, "b") == Row("b", 1) and db.calls == 4


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


async def test_remembered_misses_are_bounded_and_forgotten_all_at_once() -> None:
    clock = Clock()
    cache: LastKnownGood[Row] = LastKnownGood(5.0, 900.0, clock, max_misses=3)
    db = Db()
    for key in "abcde":
        assert await get(cache, db, key) is None
    assert db.calls == 5
    for key in "cde":  # the three newest are remembered
        assert await get(cache, db, key) is None
    assert db.calls == 5
    assert await get(cache, db, "a") is None and db.calls == 6  # the oldest were forgotten
    cache.forget_missing()
    for key in "cde":
        await get(cache, db, key)
    assert db.calls == 9


async def test_a_miss_read_while_an_event_forgot_misses_is_not_remembered() -> None:
    cache, db, _ = make()

    async def load() -> Row | None:
        cache.forget_missing()  # e.g. a "key created" event lands during the read
        return None

    assert await cache.get("a", load) is None
    assert await get(cache, db, "a") is None and db.calls == 1  # read again, not answered


class SlowDb(Db):
    """Every read takes a loop turn or more, so concurrent callers overlap it."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    def loader(self, key: str):  # type: ignore[no-untyped-def]
        inner = super().loader(key)

        async def load() -> Row | None:
            await self.gate.wait()
            return await inner()

        return load


async def test_concurrent_reads_of_one_key_share_one_round_trip() -> None:
    cache: LastKnownGood[Row] = LastKnownGood(5.0, 900.0, Clock())
    db = SlowDb()
    db.rows["a"] = Row("a", 1)
    calls = [asyncio.ensure_future(cache.get(k, db.loader(k))) for k in ["a"] * 50 + ["z"] * 50]
    await asyncio.sleep(0)
    calls[0].cancel()  # the first caller goes away: the read it started still serves the rest
    db.gate.set()
    results = await asyncio.gather(*calls[1:])
    assert results == [Row("a", 1)] * 49 + [None] * 50
    assert db.calls == 2 and cache.loads == 2
    cache.check_integrity(lambda r: r.tenant_id)


async def test_a_caller_after_an_event_does_not_join_an_older_read() -> None:
    cache: LastKnownGood[Row] = LastKnownGood(5.0, 900.0, Clock())
    db = SlowDb()
    db.rows["a"] = Row("a", 1)
    first = asyncio.ensure_future(cache.get("a", db.loader("a")))
    await asyncio.sleep(0)
    cache.expire("a")  # an event while the first read runs
    db.rows["a"] = Row("a", 2)
    second = asyncio.ensure_future(cache.get("a", db.loader("a")))
    for _ in range(3):  # a loop turn for the caller, one for the read it starts
        await asyncio.sleep(0)
    assert db.calls == 0 and cache.loads == 2  # two reads started: the second did not join
    db.gate.set()
    assert await second == Row("a", 2) and await first is not None
    assert db.calls == 2


async def test_refresh_reads_even_a_fresh_entry() -> None:
    cache, db, _ = make()
    db.rows["a"] = Row("a", 1)
    await get(cache, db, "a")
    db.rows["a"] = Row("a", 2)
    assert await get(cache, db, "a") == Row("a", 1)
    assert await cache.get("a", db.loader("a"), refresh=True) == Row("a", 2)
    assert await get(cache, db, "a") == Row("a", 2) and db.calls == 2
