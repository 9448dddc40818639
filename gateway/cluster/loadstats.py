"""Per-tenant request rates shared by every gateway (Redis), for replica counts.

Counts go to time buckets of ``window_s`` seconds, each a Redis hash (placement key -> count)::

    {prefix}cluster:load:{bucket}   HINCRBY key n   (flushed in batches, never per request)

Rates are read from the last *complete* bucket only, so every gateway that has flushed reads the
same numbers and computes the same replica counts. Without Redis the counts stay in-process.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import structlog

log = structlog.get_logger(__name__)


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
        self.rates: dict[str, float] = {}  # requests/s per placement key (last complete bucket)

    def _bucket(self) -> int:
        return int(self._clock() // self._window)

    def record(self, key: str) -> None:
        self._pending[(self._bucket(), key)] += 1

    async def refresh(self) -> dict[str, float]:
        """Flush this gateway's counts, read the last complete bucket; returns the rates."""
        pending, self._pending = self._pending, Counter()
        done = self._bucket() - 1
        if self._redis is None:
            for (bucket, key), n in pending.items():
                self._local.setdefault(bucket, Counter())[key] += n
            for old in [b for b in self._local if b < done]:
                del self._local[old]
            counts = dict(self._local.get(done, {}))
        else:
            counts = await self._exchange(pending, done)
        self.rates = {k: int(n) / self._window for k, n in counts.items()}
        return self.rates

    async def _exchange(self, pending: Counter[tuple[int, str]], done: int) -> dict[str, int]:
        ttl = max(1, int(self._window * 4))
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for (bucket, key), n in pending.items():
                    pipe.hincrby(f"{self._prefix}{bucket}", key, n)
                    pipe.expire(f"{self._prefix}{bucket}", ttl)
                pipe.hgetall(f"{self._prefix}{done}")
                results = await pipe.execute()
        except Exception as exc:  # Redis down: keep the last rates, retry next time
            log.warning("cluster_load_stats_unavailable", error=type(exc).__name__)
            for item, n in pending.items():
                self._pending[item] += n
            return {k: round(v * self._window) for k, v in self.rates.items()}
        raw = results[-1]
        return {_text(k): int(v) for k, v in raw.items()}

    async def close(self) -> None:
        if self._redis is not None:
            with contextlib.suppress(Exception):
                await self._redis.aclose()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
