"""The client load of ``kvgate bench cluster``: a request plan fixed by the seed, the clients
that send it, and where each request's uncached tokens come from.

The plan (arrival times, tenants, which conversation a turn continues, the user's tokens) is a
pure function of the workload and the seed, drawn before the run from its own rng: every policy
gets the same requests in the same order. A follow-up turn waits for its conversation's previous
turn (a user reads the answer first), so only its send time, never its content, depends on the
policy's latency.

Where misses come from, per request (tokens)::

    prompt = cached + first_sight + avoidable
    first_sight   tokens past the longest prefix (in full blocks) that any earlier request of
                  the run sent: only a pin made before the run could have had them cached (a
                  rare tenant's first request, a turn's new tokens, the previous answer's
                  tokens: which of those the engine keeps is the engine's business, the same
                  under every policy)
    avoidable     the rest of the uncached tokens: an earlier request saw them, the policy
                  routed this one where they were not (or not any more) cached
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from hashlib import blake2b
from typing import Any

BLOCK = 16


@dataclass(frozen=True)
class Workload:
    tenants: int = 40
    system_blocks: int = 64
    zipf_s: float = 1.1
    rate: float = 6.0  # requests/s
    duration_s: float = 20.0
    user_tokens: int = 12
    max_tokens: int = 6
    max_turns: int = 4
    p_follow_up: float = 0.5

    @property
    def kv_cache_bytes(self) -> int:
        """Pin budget (half the pool) x 3 = all system prompts."""
        budget = self.tenants * self.system_blocks // 3
        return 2 * budget * BLOCK_BYTES


BLOCK_BYTES = 65536  # demo model: 4 layers x 2 (K, V) x 2 heads x 64 dims x 4 bytes x 16 tokens


@dataclass(frozen=True)
class Planned:
    at: float  # seconds after the load starts
    tenant: int
    conv: int  # conversation id (run-wide)
    turn: int  # 0 for a new conversation
    user: tuple[int, ...]


@dataclass(frozen=True)
class RouteNote:
    """What the router saw and chose for one request (its last try)."""

    worker: str
    reason: str
    placed: tuple[str, ...]  # the tenant's placement set
    pinned: tuple[str, ...]  # workers holding the tenant's pin
    index_blocks: int  # longest prefix the KV index shows on some worker
    index_holders: tuple[str, ...]


@dataclass
class Sample:
    start: float
    prompt: int
    tenant: int = -1
    conv: int = -1
    turn: int = 0
    seen: int = 0  # tokens of the longest prefix an earlier request saw (full blocks)
    cached: int = 0
    ttft: float | None = None
    error: str | None = None
    route: RouteNote | None = None

    @property
    def first_sight(self) -> int:
        return min(self.prompt - self.cached, self.prompt - self.seen)

    @property
    def avoidable(self) -> int:
        return self.prompt - self.cached - self.first_sight


def system_prompt(tenant: int, blocks: int) -> list[int]:
    rng = random.Random(tenant)
    return [rng.randrange(3, 1500) for _ in range(blocks * BLOCK)]


def namespace(tenant: int, salt: str) -> str:
    """Each run salts its namespaces: workers reused across runs share no cached blocks."""
    return f"bench-{salt}-tenant-{tenant}"


def plan_requests(w: Workload, seed: int) -> list[Planned]:
    """Poisson arrivals, Zipf tenants; a turn continues one of the tenant's conversations that
    has turns left with probability ``p_follow_up``, else starts a new one."""
    rng = random.Random(seed)
    weights = [1 / (i + 1) ** w.zipf_s for i in range(w.tenants)]
    convs: dict[int, list[int]] = {}  # tenant -> its conversation ids
    turns: list[int] = []  # conversation id -> turns planned
    out: list[Planned] = []
    at = rng.expovariate(w.rate)
    while at < w.duration_s:
        tenant = rng.choices(range(w.tenants), weights)[0]
        open_ = [c for c in convs.get(tenant, []) if turns[c] < w.max_turns]
        if open_ and rng.random() < w.p_follow_up:
            conv = rng.choice(open_)
        else:
            conv = len(turns)
            turns.append(0)
            convs.setdefault(tenant, []).append(conv)
        user = tuple(rng.randrange(3, 1500) for _ in range(w.user_tokens))
        out.append(Planned(at, tenant, conv, turns[conv], user))
        turns[conv] += 1
        at += rng.expovariate(w.rate)
    return out


def plan_digest(samples: Sequence[Sample]) -> str:
    """The requests a run sent (tenant, conversation, turn, prompt length), in plan order."""
    rows = sorted((s.tenant, s.conv, s.turn, s.prompt) for s in samples)
    return blake2b(repr(rows).encode(), digest_size=8).hexdigest()


class Seen:
    """Block-chained prefixes of every prompt sent in this run."""

    def __init__(self) -> None:
        self._keys: set[bytes] = set()

    @staticmethod
    def _chain(tenant: int, ids: Sequence[int], n: int) -> list[bytes]:
        keys, key = [], tenant.to_bytes(4, "big")
        for i in range(n):
            block = repr(tuple(ids[i * BLOCK : (i + 1) * BLOCK])).encode()
            key = blake2b(key + block, digest_size=16).digest()
            keys.append(key)
        return keys

    def longest(self, tenant: int, ids: Sequence[int]) -> int:
        """Tokens of the longest prefix seen, in full blocks the engine may reuse."""
        n = 0
        for key in self._chain(tenant, ids, (len(ids) - 1) // BLOCK):
            if key not in self._keys:
                break
            n += 1
        return n * BLOCK

    def add(self, tenant: int, ids: Sequence[int]) -> None:
        self._keys.update(self._chain(tenant, ids, len(ids) // BLOCK))


def trace_routes(eng: Any, notes: dict[int, RouteNote]) -> None:
    """Record each request's route (by the id of its token list) with the tenant's placement
    and pin holders as the router saw them."""
    inner = eng._route

    def route(key: str, ns: str, ids: Sequence[int], tried: set[str]) -> Any:
        r = inner(key, ns, ids, tried)
        pin = eng.placer.pins.get(key)
        blocks, holders = eng.index.longest(ns, ids, eng.block_size)
        notes[id(ids)] = RouteNote(
            r.member.worker_id,
            r.reason,
            tuple(eng.placer.placement.workers_of(key)),
            tuple(sorted(pin.handles)) if pin is not None else (),
            blocks,
            tuple(sorted(holders)),
        )
        return r

    eng._route = route  # observation only: the same choice, recorded


@dataclass
class Conversation:
    tenant: int
    tokens: list[int]
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


async def client_load(
    eng: Any, w: Workload, plan: Sequence[Planned], t0: float, samples: list[Sample], salt: str
) -> None:
    from engine.params import SamplingParams

    params = SamplingParams(max_tokens=w.max_tokens, temperature=0.0, ignore_eos=True)
    notes: dict[int, RouteNote] = {}
    trace_routes(eng, notes)
    convs: dict[int, Conversation] = {}
    seen = Seen()

    async def one(p: Planned, conv: Conversation) -> None:
        async with conv.lock:  # the previous turn's answer first
            ids = conv.tokens + list(p.user)
            s = Sample(time.monotonic() - t0, len(ids), p.tenant, p.conv, p.turn)
            s.seen = seen.longest(p.tenant, ids)
            seen.add(p.tenant, ids)
            answer = await _send(eng, ids, params, namespace(p.tenant, salt), s)
            s.route = notes.pop(id(ids), None)
            samples.append(s)
            conv.tokens = ids + answer

    tasks = []
    for p in plan:
        delay = t0 + p.at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if p.conv not in convs:
            convs[p.conv] = Conversation(p.tenant, system_prompt(p.tenant, w.system_blocks))
        tasks.append(asyncio.create_task(one(p, convs[p.conv])))
    await asyncio.gather(*tasks)


async def _send(eng: Any, ids: list[int], params: Any, ns: str, s: Sample) -> list[int]:
    from engine.api import GenerateOptions

    started = time.monotonic()
    answer: list[int] = []
    try:
        async for out in eng.generate(ids, params, GenerateOptions(ns)):
            if s.ttft is None:
                s.ttft = time.monotonic() - started
            s.cached = out.num_cached_tokens
            answer = list(out.token_ids)
    except Exception as exc:
        s.error = type(exc).__name__
    return answer
