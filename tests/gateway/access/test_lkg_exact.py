"""Last-known-good cache, acting on exact events: revisions, per-entry expiry, permanent
revocations (bounded memory), and loads that overlap an event of their own tenant only."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.access.lkg import LastKnownGood
from tenants.errors import StoreUnavailable
from tests.gateway.access.test_lkg import Db, Row, make


async def get(cache: LastKnownGood[Row], db: Db, key: str) -> Row | None:
    """A read, then the integrity check (keys here are not tenant ids: one tenant, many keys)."""
    value = await cache.get(key, db.loader(key))
    cache.check_integrity()
    return value


async def test_revise_applies_the_change_and_an_outage_serves_the_revised_value() -> None:
    cache, db, _ = make()
    db.rows["a"] = Row("a", 1)
    db.rows["b"] = Row("b", 1)
    await get(cache, db, "a")
    await get(cache, db, "b")
    cache.revise("a", lambda r: dataclasses.replace(r, version=9))
    db.down = True
    assert await get(cache, db, "a") == Row("a", 9)  # reload failed: the revision is served
    db.down = False
    db.rows["a"] = Row("a", 10)
    calls = db.calls
    assert await get(cache, db, "a") == Row("a", 10)  # reloaded, the database wins
    assert await get(cache, db, "b") == Row("b", 1) and db.calls == calls + 1  # b stayed fresh


async def test_expire_where_reloads_only_matching_entries() -> None:
    cache, db, _ = make()
    for version, key in enumerate(("k1", "k2"), start=1):
        db.rows[key] = Row("a", version)
        await get(cache, db, key)
    calls = db.calls
    cache.expire_where("a", lambda r: r.version == 1)
    await get(cache, db, "k1")
    await get(cache, db, "k2")
    assert db.calls == calls + 1
    cache.expire_where("b", lambda r: True)  # another tenant's entries only
    await get(cache, db, "k2")
    assert db.calls == calls + 1


async def test_revoked_keys_answer_none_without_a_read_and_memory_is_bounded() -> None:
    _, db, _ = make()
    cache: LastKnownGood[Row] = LastKnownGood(5.0, 900.0, max_revoked=2)
    for version, key in enumerate(("k1", "k2", "k3"), start=1):
        db.rows[key] = Row("a", version)
        await get(cache, db, key)
    cache.revoke_where("a", lambda r: r.version == 1)
    db.down = True
    assert await get(cache, db, "k1") is None  # refused during the outage, no read
    calls = db.calls
    assert await get(cache, db, "k1") is None and db.calls == calls
    cache.revoke("k2")
    cache.revoke("never-cached")
    cache.check_integrity()
    # Only the last two revocations are remembered: k1 is read again (the database answers).
    db.down = False
    del db.rows["k1"]
    assert await get(cache, db, "k1") is None and db.calls == calls + 1
    assert await get(cache, db, "k2") is None and db.calls == calls + 1
    assert await get(cache, db, "k3") == Row("a", 3)


async def test_a_load_overlapping_an_event_of_its_tenant_is_not_served_in_an_outage() -> None:
    cache, db, _ = make()
    db.rows["a"] = Row("a", 1)
    db.rows["b"] = Row("b", 1)

    def load_then_event(key: str, tenant: str):  # type: ignore[no-untyped-def]
        async def load() -> Row | None:
            row = db.rows[key]  # read before the change commits ...
            cache.expire(tenant)  # ... whose event arrives while this load is in flight
            return row

        return load

    assert await cache.get("a", load_then_event("a", "a")) == Row("a", 1)
    assert await cache.get("b", load_then_event("b", "a")) == Row("b", 1)
    cache.check_integrity(lambda r: r.tenant_id)
    db.down = True
    with pytest.raises(StoreUnavailable):  # may predate the change: never served stale
        await get(cache, db, "a")
    calls = db.calls
    assert await get(cache, db, "b") == Row("b", 1)  # another tenant's event: fresh as read
    assert db.calls == calls
