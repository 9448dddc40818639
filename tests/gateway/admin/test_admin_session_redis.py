"""``RedisSessionStore`` against the machine's Redis: keys by digest, idle TTL restarted by
use, absolute expiry from ``started``, sign-out, ``expire_all`` by its own prefix only."""

from __future__ import annotations

import asyncio
import hashlib
import json

import redis.asyncio as aioredis

from gateway.admin import RedisSessionStore
from gateway.ratelimit.redis import make_client
from tests.conftest import SHARED_REDIS_URL


def store(prefix: str, idle_s: float = 60.0, max_s: float = 3600.0) -> RedisSessionStore:
    return RedisSessionStore(make_client(SHARED_REDIS_URL, 1.0), prefix, idle_s, max_s)


async def test_a_session_is_kept_by_the_digest_of_its_id(
    shared_redis: aioredis.Redis, redis_prefix: str
) -> None:
    sessions = store(redis_prefix, idle_s=60.0)
    try:
        sid, opened = await sessions.open("d" * 64, "admin")
        keys = [k.decode() async for k in shared_redis.scan_iter(match=f"{redis_prefix}*")]
        digest = hashlib.sha256(sid.encode()).hexdigest()
        assert keys == [f"{redis_prefix}admin:session:{digest}"]
        raw = await shared_redis.get(keys[0])
        assert raw is not None
        value = json.loads(raw)
        assert value == {
            "digest": "d" * 64,
            "principal_id": "admin",
            "csrf": opened.csrf,
            "started": opened.started,
        }
        assert sid not in json.dumps(value) and 0 < await shared_redis.pttl(keys[0]) <= 60_000
        await shared_redis.pexpire(keys[0], 5_000)
        assert await sessions.get(sid) == opened
        assert await shared_redis.pttl(keys[0]) > 5_000  # each use restarts the idle TTL
        assert await sessions.get(sid + "x") is None
        await sessions.close(sid)
        assert await sessions.get(sid) is None and not await shared_redis.exists(keys[0])
    finally:
        await sessions.aclose()


async def test_the_absolute_expiry_holds_while_the_session_is_used(
    shared_redis: aioredis.Redis, redis_prefix: str
) -> None:
    sessions = store(redis_prefix, idle_s=60.0, max_s=0.5)
    try:
        sid, _ = await sessions.open("d" * 64, "admin")
        key = sessions.key(sid)
        await shared_redis.pexpire(key, 60_000)  # only ``started`` can end it now
        await asyncio.sleep(0.6)
        assert await sessions.get(sid) is None
        assert not await shared_redis.exists(key)
    finally:
        await sessions.aclose()


async def test_expire_all_ends_only_this_prefix(
    shared_redis: aioredis.Redis, redis_prefix: str
) -> None:
    # "*" in a prefix is a literal: SCAN must not read it as a pattern and take the other's keys
    ours, theirs = store(f"{redis_prefix}*:"), store(f"{redis_prefix}other:")
    try:
        mine = [(await ours.open("a" * 64, "admin"))[0] for _ in range(3)]
        other, _ = await theirs.open("b" * 64, "admin")
        await shared_redis.set(f"{redis_prefix}unrelated", "1")
        await ours.expire_all()
        assert [await ours.get(sid) for sid in mine] == [None, None, None]
        assert await theirs.get(other) is not None
        assert await shared_redis.get(f"{redis_prefix}unrelated") == b"1"
    finally:
        await ours.aclose()
        await theirs.aclose()


async def test_a_value_it_did_not_write_is_no_session(
    shared_redis: aioredis.Redis, redis_prefix: str
) -> None:
    sessions = store(redis_prefix)
    try:
        sid = "not-a-real-session"
        await shared_redis.set(sessions.key(sid), b"{not json")
        assert await sessions.get(sid) is None
    finally:
        await sessions.aclose()
