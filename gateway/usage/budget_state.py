"""Where budget counters live: Redis (exact across gateway replicas: one Lua call per admission)
or this process (no Redis configured). Both implement the same three operations.

A counter is the tokens and nano-USD used in one budget window, reservations included::

    {prefix}bg:{<tenant>}:<scope>:<window>     hash {t: tokens, s: spend nanos}
        scope: "tenant" or "key:<key id>"; window: "d20270120" / "m202701" (budget time zone)

``admit`` takes a reservation from every counter when each is under its limit (used < max:
a request is admitted while its budget is not yet spent, so the most a budget can end up over
is one request's reservation), or names the first that is not, or the first that does not exist
(Redis lost it: the caller seeds it from the ledger's rollups and asks again). ``settle`` adds
the difference between what was used and what was reserved; a counter that vanished meanwhile
is left alone (its seed from the rollups includes the record).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import redis.asyncio as aioredis

BUDGET_LUA = r"""
local mode = ARGV[1]
if mode == 'admit' then
  -- per key: max tokens, max spend (-1: none), reserve tokens, reserve spend, ttl ms
  for i = 1, #KEYS do
    if redis.call('EXISTS', KEYS[i]) == 0 then return {2, i} end
  end
  for i = 1, #KEYS do
    local b = 2 + (i - 1) * 5
    local mt, ms = tonumber(ARGV[b]), tonumber(ARGV[b + 1])
    local v = redis.call('HMGET', KEYS[i], 't', 's')
    local t, s = tonumber(v[1] or '0'), tonumber(v[2] or '0')
    if (mt >= 0 and t >= mt) or (ms >= 0 and s >= ms) then return {1, i} end
  end
  local out = {0, 0}
  for i = 1, #KEYS do
    local b = 2 + (i - 1) * 5
    out[#out + 1] = redis.call('HINCRBY', KEYS[i], 't', ARGV[b + 2])
    out[#out + 1] = redis.call('HINCRBY', KEYS[i], 's', ARGV[b + 3])
    redis.call('PEXPIRE', KEYS[i], ARGV[b + 4])
  end
  return out
elseif mode == 'seed' then
  -- per key: tokens, spend, ttl ms (only where the counter does not exist yet)
  for i = 1, #KEYS do
    local b = 2 + (i - 1) * 3
    redis.call('HSETNX', KEYS[i], 't', ARGV[b])
    redis.call('HSETNX', KEYS[i], 's', ARGV[b + 1])
    redis.call('PEXPIRE', KEYS[i], ARGV[b + 2])
  end
  return 1
else
  -- settle, per key: token delta, spend delta
  for i = 1, #KEYS do
    local b = 2 + (i - 1) * 2
    if redis.call('EXISTS', KEYS[i]) == 1 then
      redis.call('HINCRBY', KEYS[i], 't', ARGV[b])
      redis.call('HINCRBY', KEYS[i], 's', ARGV[b + 1])
    end
  end
  return 1
end
"""

OK, OVER, MISSING = 0, 1, 2


@dataclass(frozen=True)
class Take:
    """One counter of an admission: its key, limits (None: none) and the reservation."""

    key: str
    max_tokens: int | None
    max_spend: int | None
    tokens: int
    spend: int
    ttl_ms: int


@dataclass(frozen=True)
class AdmitResult:
    status: int  # OK, OVER, MISSING
    index: int  # the counter that is over or missing (0-based)
    used: tuple[tuple[int, int], ...] = ()  # (tokens, spend) of each counter after the take


class BudgetState(Protocol):
    async def admit(self, takes: Sequence[Take]) -> AdmitResult: ...
    async def seed(self, seeds: Sequence[tuple[str, int, int, int]]) -> None: ...
    async def settle(self, deltas: Sequence[tuple[str, int, int]]) -> None: ...
    async def close(self) -> None: ...


class RedisBudgetState:
    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self._script = client.register_script(BUDGET_LUA)

    async def admit(self, takes: Sequence[Take]) -> AdmitResult:
        args: list[str | int | float] = ["admit"]
        for t in takes:
            args += [_lim(t.max_tokens), _lim(t.max_spend), t.tokens, t.spend, t.ttl_ms]
        out = [int(v) for v in await self._script(keys=[t.key for t in takes], args=args)]
        if out[0] != OK:
            return AdmitResult(out[0], out[1] - 1)
        pairs = tuple((out[i], out[i + 1]) for i in range(2, len(out), 2))
        return AdmitResult(OK, -1, pairs)

    async def seed(self, seeds: Sequence[tuple[str, int, int, int]]) -> None:
        args: list[str | int | float] = ["seed"]
        for _, tokens, spend, ttl in seeds:
            args += [tokens, spend, ttl]
        await self._script(keys=[s[0] for s in seeds], args=args)

    async def settle(self, deltas: Sequence[tuple[str, int, int]]) -> None:
        args: list[str | int | float] = ["settle"]
        for _, dt, ds in deltas:
            args += [dt, ds]
        await self._script(keys=[d[0] for d in deltas], args=args)

    async def close(self) -> None:
        await self.client.aclose()


def _lim(value: int | None) -> int:
    return -1 if value is None else value


class MemoryBudgetState:
    """The same operations in this process (exact for one gateway; expiry is not needed: a
    window's counter is never read after the window ends)."""

    def __init__(self) -> None:
        self.counters: dict[str, list[int]] = {}

    async def admit(self, takes: Sequence[Take]) -> AdmitResult:
        for i, t in enumerate(takes):
            if t.key not in self.counters:
                return AdmitResult(MISSING, i)
        for i, t in enumerate(takes):
            used_t, used_s = self.counters[t.key]
            if (t.max_tokens is not None and used_t >= t.max_tokens) or (
                t.max_spend is not None and used_s >= t.max_spend
            ):
                return AdmitResult(OVER, i)
        used = []
        for t in takes:
            c = self.counters[t.key]
            c[0] += t.tokens
            c[1] += t.spend
            used.append((c[0], c[1]))
        return AdmitResult(OK, -1, tuple(used))

    async def seed(self, seeds: Sequence[tuple[str, int, int, int]]) -> None:
        for key, tokens, spend, _ in seeds:
            self.counters.setdefault(key, [tokens, spend])

    async def settle(self, deltas: Sequence[tuple[str, int, int]]) -> None:
        for key, dt, ds in deltas:
            c = self.counters.get(key)
            if c is not None:
                c[0] += dt
                c[1] += ds

    async def close(self) -> None:
        return None
