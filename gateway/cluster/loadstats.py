"""Per-tenant request rates shared by every gateway (Redis), for replica counts.

Counts go to time buckets of ``window_s`` seconds, each a Redis hash (placement key -> count)::

    {prefix}cluster:load:{bucket}   HINCRBY key n   (flushed in batches, never per request)

Rates are the mean over the last ``BUCKETS`` *complete* buckets only, so every gateway that has
flushed reads the same numbers and computes the same replica counts, and a tenant's rate moves
smoothly (placement follows it without churn). Without Redis the counts stay in-process.

A complete bucket still changes until every gateway has flushed its last counts into it (one
flush per health round); ``settle_s`` after its end it is final, and its counts, read once more,
are kept here: a refresh reads only the buckets not yet settled (one or two, not ``BUCKETS``).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = structlog.get_logger(__name__)
BUCKETS = 6  # complete windows averaged into a rate


class LoadStats:
    def __init__(
        self,
        redis: Redis | None,
        prefix: str,
        window_s: float,
        clock: Callable[[], float] = time.time,
        settle_s: float = 3.0,  # > the flush interval of every gateway (their health rounds)
    ) -> None:
        self._redis = redis
        self._prefix = f"{prefix}cluster:load:"
        self._window = window_s
        self._clock = clock
        self._settle_s = settle_s
        self._settled: dict[int, Counter[str]] = {}  # final counts of buckets read after settling
        self._pending: Counter[tuple[int, str]] = Counter()
        self._local: dict[int, Counter[str]] = {}  # without Redis: bucket -> counts
        self.rates: dict[str, float] = {}  # requests/s per placement key (complete buckets)

    def _bucket(self) -> int:
        return int(self._clock() // self._window)

    def record(self, key: str) -> None:
        self._pending[(self._bucket(), key)] += 1

    async def refresh(self) -> dict[str, float]:
        """Flush this gateway's counts, read the last complete bucket; returns the rates."""
        pending, self._pending = self._pending, Counter()
        done = range(self._bucket() - BUCKETS, self._bucket())
        if self._redis is None:
            for (bucket, key), n in pending.items():
                self._local.setdefault(bucket, Counter())[key] += n
            for old in [b for b in self._local if b < done.start]:
                del self._local[old]
            counts: Counter[str] = Counter()
            for b in done:
                counts.update(self._local.get(b, {}))
        else:
            counts = await self._exchange(self._redis, pending, done)
        span = self._window * BUCKETS
        self.rates = {k: int(n) / span for k, n in counts.items()}
        return self.rates

    async def _exchange(
        self, redis: Redis, pending: Counter[tuple[int, str]], done: range
    ) -> Counter[str]:
        ttl = max(1, int(self._window * (BUCKETS + 2)))
        for old in [b for b in self._settled if b < done.start]:
            del self._settled[old]
        unread = [b for b in done if b not in self._settled]
        try:
            async with redis.pipeline(transaction=False) as pipe:
                for (bucket, key), n in pending.items():
                    pipe.hincrby(f"{self._prefix}{bucket}", key, n)
                    pipe.expire(f"{self._prefix}{bucket}", ttl)
                for bucket in unread:
                    pipe.hgetall(f"{self._prefix}{bucket}")
                results = await pipe.execute()
        except Exception as exc:  # Redis down: keep the last rates, retry next time
            log.warning("cluster_load_stats_unavailable", error=type(exc).__name__)
            for item, n in pending.items():
                self._pending[item] += n
            return Counter({k: round(v * self._window * BUCKETS) for k, v in self.rates.items()})
        read = results[len(results) - len(unread) :]
        now = self._clock()
        counts: Counter[str] = Counter()
        for bucket, raw in zip(unread, read, strict=True):
            bucket_counts = Counter({_text(k): int(v) for k, v in raw.items()})
            if now >= (bucket + 1) * self._window + self._settle_s:
                self._settled[bucket] = bucket_counts
            counts.update(bucket_counts)
        for bucket in done:
            if bucket not in unread:
                counts.update(self._settled[bucket])
        return counts

    async def close(self) -> None:
        if self._redis is not None:
            with contextlib.suppress(Exception):
                await self._redis.aclose()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
