from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from tenants.keys import LastUsedRecorder, generate_key, hash_key, key_matches, key_prefix
from tenants.models import ApiKey
from tenants.store import TenantStore
from tests.tenants.factories import make_key, make_tenant


def test_key_format_hash_and_compare() -> None:
    a, b = generate_key(), generate_key()
    assert a.key != b.key and a.prefix != b.prefix and a.id != b.id
    assert key_prefix(a.key) == a.prefix
    assert a.secret_sha256 == hash_key(a.key) and len(a.secret_sha256) == 64
    assert key_matches(a.key, a.secret_sha256)
    assert not key_matches(b.key, a.secret_sha256)
    assert a.key not in repr(a)
    for bad in ("", "kvg_", a.key + "x", a.key.replace("kvg_", "sk_"), a.key.upper()):
        assert key_prefix(bad) is None


async def _last_used(store: TenantStore, key_id: str) -> datetime | None:
    async with store.sessions() as s:
        return await s.scalar(select(ApiKey.last_used_at).where(ApiKey.id == key_id))


async def test_last_used_recorder_batches_and_only_moves_forward(store: TenantStore) -> None:
    tid = await make_tenant(store)
    k1, _ = await make_key(store, tid)
    k2, _ = await make_key(store, tid)
    rec = LastUsedRecorder()
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(100):  # many uses, no database writes until flush
        rec.record(k1, t0 + timedelta(seconds=i))
    rec.record(k2, t0)
    rec.check_integrity()
    assert rec.pending == 2 and await _last_used(store, k1) is None
    assert await rec.flush(store.sessions) == 2
    assert rec.pending == 0
    assert await _last_used(store, k1) == t0 + timedelta(seconds=99)
    rec.record(k1, t0)  # an older timestamp (another replica's late flush) never moves it back
    await rec.flush(store.sessions)
    assert await _last_used(store, k1) == t0 + timedelta(seconds=99)
    assert await _last_used(store, k2) == t0


async def test_last_used_recorder_keeps_pending_on_failure() -> None:
    broken = TenantStore.open("postgresql+asyncpg://postgres@127.0.0.1:1/none")
    rec = LastUsedRecorder()
    rec.record("key_x")
    try:
        with pytest.raises(OSError):
            await rec.flush(broken.sessions)
    finally:
        await broken.aclose()
    assert rec.pending == 1


async def test_last_used_recorder_periodic_task(store: TenantStore) -> None:
    tid = await make_tenant(store)
    kid, _ = await make_key(store, tid)
    rec = LastUsedRecorder()
    rec.start(store.sessions, interval_s=0.01)
    rec.record(kid)
    await rec.aclose(store.sessions)
    assert await _last_used(store, kid) is not None
