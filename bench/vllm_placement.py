"""Row (b) of ``kvgate bench vllm-backend``: where tenants' prompts are found over two vLLM
replicas, for three placement and routing policies over the same ``ClusterEngine``::

    kvgate        KV-event driven: tenants' prompts placed on replicas by load (the placer),
                  prewarmed there and re-warmed when the server's events say their blocks went;
                  requests routed to where the index (the servers' KV events) shows the prompt
    round_robin   no placement, requests to the replicas in turn (what a generic gateway does)
    tenant_hash   no placement, a tenant's requests all to replica hash(tenant) mod 2

Every policy gets the same request plan (seeded): Zipf(s) tenant popularity over ``tenants``
tenants, Poisson arrivals, one turn per request: the tenant's system prompt (one KV block of the
server, 128 tokens on the CPU, and one token more) and a few user tokens. The replicas' prefix
caches are sized so that the tenants' prompts take ~3x one replica's capacity. Each policy runs
under its own namespaces (salts): nothing one policy left in a cache serves another. Reported
per policy: prompt tokens served from cache (the servers' ``cached_tokens``) over the requests
after the warm-up share, TTFT p50/p99, and the re-warms (a placed prompt sent again after the
server evicted its blocks).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from hashlib import blake2b
from typing import Any

from bench.common import percentile

POLICIES = ("round_robin", "tenant_hash", "kvgate")
WARM_UP = 0.25  # share of a run's requests that only count in the "with warm-up" figures


@dataclass(frozen=True)
class Load:
    tenants: int = 24
    # one vLLM CPU block (128) and the token that is always computed: the block is reusable
    prompt_tokens: int = 129
    user_tokens: int = 12
    max_tokens: int = 4
    requests: int = 40
    rate: float = 1.5  # requests/s
    zipf_s: float = 1.1
    seed: int = 1


@dataclass(frozen=True)
class Planned:
    at: float
    tenant: int
    user: tuple[int, ...]


@dataclass
class Sample:
    tenant: int
    prompt: int
    cached: int = 0
    ttft: float | None = None
    worker: str | None = None
    error: str | None = None


@dataclass
class PolicyRun:
    policy: str
    samples: list[Sample] = field(default_factory=list)
    pins: int = 0
    pinned_anywhere: int = 0
    pin_refusals: list[str] = field(default_factory=list)
    rewarms: int = 0
    duration_s: float = 0.0


def plan(load: Load) -> list[Planned]:
    rng = random.Random(load.seed)
    weights = [1 / (i + 1) ** load.zipf_s for i in range(load.tenants)]
    out, at = [], 0.0
    for _ in range(load.requests):
        at += rng.expovariate(load.rate)
        tenant = rng.choices(range(load.tenants), weights)[0]
        out.append(Planned(at, tenant, tuple(rng.randrange(300, 9000) for _ in range(12))))
    return out


def system_prompt(tenant: int, n: int) -> list[int]:
    rng = random.Random(1000 + tenant)
    return [rng.randrange(300, 9000) for _ in range(n)]


def _digest(text: str) -> int:
    return int.from_bytes(blake2b(text.encode(), digest_size=8).digest(), "big")


def baseline_route(policy: str, eng: Any) -> Callable[..., Any]:
    """The engine's router replaced by the policy's choice (the bench swaps it; production has
    one); everything else (health, retries, the dispatcher) stays the engine's."""
    from engine.remote.client import WorkerUnavailable
    from gateway.cluster.router import Route

    turn = iter(range(1 << 62))

    def route(key: str, ns: str, ids: Sequence[int], tried: set[str], *rest: Any) -> Route:
        live = sorted(w for w in eng.healthy() if w not in tried)
        if not live:
            raise WorkerUnavailable("no healthy replica")
        i = next(turn) if policy == "round_robin" else _digest(key)
        return Route(eng.healthy()[live[i % len(live)]], policy)

    return route


async def run_policy(policy: str, eng: Any, load: Load, salt: str) -> PolicyRun:
    """``eng``: a started ClusterEngine over the replicas (its own for this policy)."""
    from engine.api import GenerateOptions
    from engine.params import SamplingParams

    run = PolicyRun(policy)
    ns = [f"bench-vllm-{salt}-{policy}-t{t}" for t in range(load.tenants)]
    prompts = [system_prompt(t, load.prompt_tokens) for t in range(load.tenants)]
    if policy == "kvgate":
        from engine.errors import PinRejected

        for t in range(load.tenants):
            try:
                await eng.pin(f"t{t}", ns[t], prompts[t])
            except PinRejected as exc:
                run.pin_refusals.append(f"t{t}: {exc}")
        await eng.settle()
        await eng.placer.warmed()  # the start's prefills of unplaced prompts: before traffic
        run.pins = len(eng.placer.pins)
        run.pinned_anywhere = sum(1 for p in eng.placer.pins.values() if p.handles)
    else:
        eng._route = baseline_route(policy, eng)
    rewarms0 = _rewarms(eng)
    params = SamplingParams(max_tokens=load.max_tokens, temperature=0.0, ignore_eos=True)

    async def one(p: Planned) -> None:
        ids = prompts[p.tenant] + list(p.user)
        s = Sample(p.tenant, len(ids))
        started = time.monotonic()
        try:
            async for out in eng.generate(ids, params, GenerateOptions(ns[p.tenant])):
                if s.ttft is None:
                    s.ttft = time.monotonic() - started
                    s.worker = out.worker
                s.cached = out.num_cached_tokens
        except Exception as exc:
            s.error = type(exc).__name__
        run.samples.append(s)

    t0 = time.monotonic()
    tasks = []
    for p in plan(load):
        delay = t0 + p.at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(p)))
    await asyncio.gather(*tasks)
    run.duration_s = time.monotonic() - t0
    run.rewarms = _rewarms(eng) - rewarms0
    return run


def _rewarms(eng: Any) -> int:
    return sum(int(getattr(m.client, "rewarms", 0)) for m in eng.members.values())


def summarize(run: PolicyRun) -> dict[str, Any]:
    ok = [s for s in run.samples if s.error is None]
    steady = ok[int(len(ok) * WARM_UP) :]
    ttft = [s.ttft for s in steady if s.ttft is not None]
    workers: dict[str, int] = {}
    for s in ok:
        workers[s.worker or "?"] = workers.get(s.worker or "?", 0) + 1
    return {
        "policy": run.policy,
        "requests": len(run.samples),
        "errors": len(run.samples) - len(ok),
        "cached_share": _share(steady),
        "cached_share_with_warm_up": _share(ok),
        "cached_tokens": sum(s.cached for s in steady),
        "prompt_tokens": sum(s.prompt for s in steady),
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "per_replica": workers,
        "placed_prompts": run.pins,
        "placed_somewhere": run.pinned_anywhere,
        "pin_refusals": run.pin_refusals,
        "rewarms": run.rewarms,
        "rewarms_per_placed_prompt": run.rewarms / run.pins if run.pins else None,
        "duration_s": run.duration_s,
    }


def _share(samples: Sequence[Sample]) -> float:
    prompt = sum(s.prompt for s in samples)
    return sum(s.cached for s in samples) / prompt if prompt else 0.0
