"""Per-tenant request rates shared by every gateway (Redis), for replica counts.

Counts go to time buckets of ``window_s`` seconds, each a Redis hash (placement key -> count)::

    {prefix}cluster:load:{bucket}   HINCRBY key n   (flushed in batches, never per request)

Rates are the mean over the last ``BUCKETS`` *complete* buckets only, so every gateway that has
flushed reads the same numbers and computes the same replica counts, and a tenant's rate moves
smoothly (placement follows it without churn). Without Redis the counts stay in-process.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import structlog

log = structlog.get_logger(__name__)
BUCKETS = 6  # complete windows averaged into a rate


class LoadStats:
    def __init__(
        self,
        redis: Any | None,
        prefix: str,
        window_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._redis = redis
        self._prefix = f"{prefix}cluster:load:"
        self._window = window_s
        self._clock = clock
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
            counts = await self._exchange(pending, done)
        span = self._window * BUCKETS
        self.rates = {k: int(n) / span for k, n in counts.items()}
        return self.rates

    async def _exchange(self, pending: Counter[tuple[int, str]], done: range) -> Counter[str]:
        ttl = max(1, int(self._window * (BUCKETS + 2)))
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for (bucket, key), n in pending.items():
                    pipe.hincrby(f"{self._prefix}{bucket}", key, n)
                    pipe.expire(f"{self._prefix}{bucket}", ttl)
                for bucket in done:
                    pipe.hgetall(f"{self._prefix}{bucket}")
                results = await pipe.execute()
        except Exception as exc:  # Redis down: keep the last rates, retry next time
            log.warning("cluster_load_stats_unavailable", error=type(exc).__name__)
            for item, n in pending.items():
                self._pending[item] += n
            return Counter({k: round(v * self._window * BUCKETS) for k, v in self.rates.items()})
        counts: Counter[str] = Counter()
        for raw in results[-len(done) :]:
            counts.update({_text(k): int(v) for k, v in raw.items()})
        return counts

    async def close(self) -> None:
        if self._redis is not None:
            with contextlib.suppress(Exception):
                await self._redis.aclose()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
