"""``kvgate bench cluster``: routing quality of tenant placement across worker processes.

Workers on loopback with the demo model (a 2-core machine cannot show throughput scaling, so
this measures where prompts are found, not speed). 40 tenants with 1024-token system prompts whose
blocks together take ~3x one worker's pin budget, Zipf(1.1) tenant popularity, Poisson arrivals,
multi-turn conversations (a follow-up turn carries the earlier turns). Three policies run through
the same ``ClusterEngine`` (health checks, retries, pin reconciliation); they differ only in the
placement of pins and the routing of requests::

    kvgate        HRW placement, capacity-aware, replicas by load; affinity, least-loaded, spill
    round_robin   every worker pins tenants in id order until its budget is full (what each
                  engine does alone); requests go to the workers in turn
    tenant_hash   a tenant lives on worker hash(tenant) mod N (pinned there if it fits)

Hit rate: prompt tokens served from cache over the requests of the second half of a run (steady
state: the tenants' request rates, averaged over 12 s, have settled, and so has the placement that
follows them; ``hit_rate_with_warm_up`` counts every request, first sights of cold prompts too).

Scenarios: steady state with 2 and 3 workers; one worker of 3 killed; a third worker added to
2. Re-placement time: from the kill (or from the new worker first answering) until every tenant's
pins match the placement over the live workers. Hit-rate dip: the lowest prompt-cache hit rate
of a 2-second window after the event, against the mean of the windows before it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from hashlib import blake2b
from pathlib import Path
from typing import Any

from bench.common import percentile, print_table, write_json

RESULTS = Path(__file__).resolve().parent / "results"
TOKEN = "bench-cluster-token"
BLOCK = 16
BLOCK_BYTES = 65536  # demo model: 4 layers x 2 (K, V) x 2 heads x 64 dims x 4 bytes x 16 tokens
WINDOW_S = 2.0
WARM_UP = 0.5  # share of a run whose requests count only in hit_rate_with_warm_up
LOAD_WINDOW_S = 2.0  # tenant rate buckets: 6 of them (12 s) fill within the warm-up
EVENT_AT = 0.6  # share of a run after which a worker is killed or added


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


@dataclass
class Sample:
    start: float
    prompt: int
    cached: int = 0
    ttft: float | None = None
    error: str | None = None


@dataclass
class Conversation:
    tenant: int
    tokens: list[int]
    turns: int = 0
    busy: bool = False


def system_prompt(tenant: int, blocks: int) -> list[int]:
    rng = random.Random(tenant)
    return [rng.randrange(3, 1500) for _ in range(blocks * BLOCK)]


def namespace(tenant: int, salt: str) -> str:
    """Each run salts its namespaces: workers reused across runs share no cached blocks."""
    return f"bench-{salt}-tenant-{tenant}"


# -- baseline policies: the same engine, another placement and routing -------------------------
def _digest(text: str) -> int:
    return int.from_bytes(blake2b(text.encode(), digest_size=8).digest(), "big")


def _baseline_engine(policy: str, eng: Any) -> Any:
    from gateway.cluster.placement import Placement
    from gateway.cluster.router import Route

    def plan(members: Mapping[str, Any], rates: Mapping[str, float]) -> Placement:
        ids = sorted(w for w, m in members.items() if m.info is not None)
        left = {w: members[w].info.pin_budget_blocks for w in ids}
        sets: dict[str, tuple[str, ...]] = {}
        for key, pin in sorted(eng.placer.pins.items()):
            if policy == "round_robin":
                want = [w for w in ids if left[w] >= pin.blocks]
            else:
                w = ids[_digest(key) % len(ids)] if ids else None
                want = [w] if w is not None and left[w] >= pin.blocks else []
            for w in want:
                left[w] -= pin.blocks
            sets[key] = tuple(want)
        used = {w: members[w].info.pin_budget_blocks - left[w] for w in ids}
        blocks = {k: p.blocks for k, p in eng.placer.pins.items()}
        budgets = {w: members[w].info.pin_budget_blocks for w in ids}
        return Placement(sets, {w: n for w, n in used.items() if n}, blocks, budgets)

    turn = iter(range(1 << 62))

    def route(key: str, ns: str, ids: Sequence[int], tried: set[str]) -> Route:
        healthy = eng.healthy()
        if not healthy:  # as the kvgate router does: late workers rather than failing
            healthy = {m.worker_id: m for m in eng.members.values() if m.info and not m.refused}
        live = sorted(w for w in healthy if w not in tried)
        if not live:
            from gateway.cluster.client import WorkerUnavailable

            raise WorkerUnavailable("no healthy worker")
        if policy == "round_robin":
            w = live[next(turn) % len(live)]
        else:
            w = live[_digest(key) % len(live)]
        return Route(healthy[w], policy)

    eng.placer.plan = plan
    eng._route = route  # the benchmark swaps the routing policy; production has one
    return eng


# -- one run -----------------------------------------------------------------------------------
@dataclass
class Run:
    policy: str
    workers: int
    samples: list[Sample] = field(default_factory=list)
    events: list[tuple[str, float]] = field(default_factory=list)
    replacement_s: float | None = None


async def _client_load(eng: Any, w: Workload, seed: int, t0: float, run: Run, salt: str) -> None:
    from engine.params import SamplingParams

    rng = random.Random(seed)
    weights = [1 / (i + 1) ** w.zipf_s for i in range(w.tenants)]
    convs: dict[int, list[Conversation]] = {}
    params = SamplingParams(max_tokens=w.max_tokens, temperature=0.0, ignore_eos=True)
    tasks = []

    async def one(conv: Conversation) -> None:
        conv.busy = True
        user = [rng.randrange(3, 1500) for _ in range(w.user_tokens)]
        ids = conv.tokens + user
        s = Sample(time.monotonic() - t0, len(ids))
        started = time.monotonic()
        answer: list[int] = []
        try:
            async for out in eng.generate(ids, params, namespace=namespace(conv.tenant, salt)):
                if s.ttft is None:
                    s.ttft = time.monotonic() - started
                s.cached = out.num_cached_tokens
                answer = list(out.token_ids)
        except Exception as exc:
            s.error = type(exc).__name__
        run.samples.append(s)
        conv.tokens = ids + answer
        conv.turns += 1
        conv.busy = False

    end = t0 + w.duration_s
    while (now := time.monotonic()) < end:
        await asyncio.sleep(rng.expovariate(w.rate))
        tenant = rng.choices(range(w.tenants), weights)[0]
        open_ = [c for c in convs.get(tenant, []) if not c.busy and c.turns < w.max_turns]
        if open_ and rng.random() < w.p_follow_up:
            conv = rng.choice(open_)
        else:
            conv = Conversation(tenant, system_prompt(tenant, w.system_blocks))
            convs.setdefault(tenant, []).append(conv)
        tasks.append(asyncio.create_task(one(conv)))
        del now
    await asyncio.gather(*tasks)


async def _wait_settled(
    eng: Any, since: float, gone: str | None = None, limit_s: float = 60.0
) -> float | None:
    """Seconds from ``since`` until the pins follow the placement (``gone`` taken out first)."""
    while time.monotonic() - since < limit_s:
        if (gone is None or gone not in eng.healthy()) and eng.placement_settled():
            return time.monotonic() - since
        await asyncio.sleep(0.05)
    return None


def start_workers(model_dir: Path, ids: list[str]) -> list[Any]:
    from concurrent.futures import ThreadPoolExecutor

    from gateway.cluster.local import LocalWorker

    # one compute thread per worker: several workers share this machine's two cores
    env = {**os.environ, "KVGATE_LOG_LEVEL": "warning", "OMP_NUM_THREADS": "1"}
    with ThreadPoolExecutor(len(ids)) as pool:
        futures = [
            pool.submit(LocalWorker.start, str(model_dir), 120, worker_id=i, token=TOKEN, env=env)
            for i in ids
        ]
        return [f.result() for f in futures]


async def stop_all(workers: list[Any]) -> None:
    await asyncio.gather(*(x.stop() for x in workers))


async def run_policy(
    policy: str,
    model_dir: Path,
    w: Workload,
    n_workers: int,
    scenario: str,
    seed: int,
    shared: list[Any] | None = None,
) -> Run:
    """``shared``: running workers to use (steady runs; pins released at the end), else fresh
    ones started here and stopped after."""
    ids = [f"w{i}" for i in range(n_workers)]
    first = ids[:-1] if scenario == "add" else ids
    workers = shared[:n_workers] if shared is not None else start_workers(model_dir, first)
    run = Run(policy, n_workers)
    try:
        await _drive(policy, model_dir, w, scenario, seed, list(workers), run)
    finally:
        if shared is None:
            await stop_all(workers)
    return run


async def _drive(
    policy: str, model_dir: Path, w: Workload, scenario: str, seed: int, workers: list, run: Run
) -> None:
    from gateway.cluster.bootstrap import fetch_bootstrap, tokenizer_from_payload
    from gateway.cluster.engine import ClusterEngine
    from gateway.cluster.loadstats import LoadStats

    salt = f"{policy}-{scenario}-{len(workers)}"
    info, payload = fetch_bootstrap(tuple(x.url for x in workers), TOKEN, 10.0)
    eng = ClusterEngine(
        tuple(x.url for x in workers), TOKEN, tokenizer=tokenizer_from_payload(payload),
        info=info, health_s=0.5, load_stats=LoadStats(None, "", LOAD_WINDOW_S),
    )  # fmt: skip
    if policy != "kvgate":
        _baseline_engine(policy, eng)
    await eng.start()
    try:
        for t in range(w.tenants):
            await eng.pin_tenant(f"t{t}", namespace(t, salt), system_prompt(t, w.system_blocks))
        t0 = time.monotonic()
        load = asyncio.create_task(_client_load(eng, w, seed, t0, run, salt))
        await _scenario(eng, scenario, workers, model_dir, w, t0, run)
        await load
        for pin in list(eng.placer.pins.values()):
            await eng.unpin(pin)
    finally:
        await eng.shutdown()


async def _scenario(
    eng: Any, scenario: str, workers: list, model_dir: Path, w: Workload, t0: float, run: Run
) -> None:
    if scenario == "steady":
        return
    await asyncio.sleep(w.duration_s * EVENT_AT)
    if scenario == "kill":
        pins = list(eng.placer.pins.values())

        def held(x: Any) -> int:
            return sum(1 for p in pins if eng.members[x.url].worker_id in p.handles)

        victim = max(workers, key=held)
        gone = eng.members[victim.url].worker_id
        at = time.monotonic()
        victim.proc.kill()
        run.events.append(("kill", at - t0))
        run.replacement_s = await _wait_settled(eng, at, gone)
        return
    new = (await asyncio.to_thread(start_workers, model_dir, [f"w{len(workers)}"]))[0]
    workers.append(new)
    eng.set_endpoints([x.url for x in workers])
    while new.url not in {m.url for m in eng.healthy().values()}:
        await asyncio.sleep(0.02)
    at = time.monotonic()
    run.events.append(("add", at - t0))
    run.replacement_s = await _wait_settled(eng, at)


# -- summaries ---------------------------------------------------------------------------------
def summarize(run: Run, w: Workload) -> dict[str, Any]:
    ok = [s for s in run.samples if s.error is None]
    ttft = [s.ttft for s in ok if s.ttft is not None]
    warm = [s for s in ok if s.start >= WARM_UP * w.duration_s]
    out: dict[str, Any] = {
        "policy": run.policy,
        "workers": run.workers,
        "requests": len(run.samples),
        "errors": len(run.samples) - len(ok),
        "hit_rate": sum(s.cached for s in warm) / max(1, sum(s.prompt for s in warm)),
        "hit_rate_with_warm_up": sum(s.cached for s in ok) / max(1, sum(s.prompt for s in ok)),
        "ttft_p50_ms": percentile(ttft, 50) * 1e3 if ttft else None,
        "ttft_p99_ms": percentile(ttft, 99) * 1e3 if ttft else None,
    }
    windows = _windows(ok, w.duration_s)
    out["hit_rate_windows"] = windows
    if run.events:
        name, at = run.events[0]
        before = [h for t, h in windows if t + WINDOW_S <= at and h is not None]
        after = [h for t, h in windows if t >= at and h is not None]
        out["event"] = {"kind": name, "at_s": round(at, 2)}
        out["replacement_s"] = run.replacement_s
        out["hit_rate_before"] = statistics.mean(before) if before else None
        out["hit_rate_min_after"] = min(after) if after else None
    return out


def _windows(samples: list[Sample], duration: float) -> list[tuple[float, float | None]]:
    out = []
    t = 0.0
    while t < duration:
        ws = [s for s in samples if t <= s.start < t + WINDOW_S]
        prompt = sum(s.prompt for s in ws)
        out.append((t, sum(s.cached for s in ws) / prompt if prompt else None))
        t += WINDOW_S
    return out


def _plot(results: list[dict[str, Any]], path: Path) -> None:
    from bench.plots import _pyplot

    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    steady = [r for r in results if "event" not in r]
    order = ["kvgate", "round_robin", "tenant_hash"]
    policies = sorted({r["policy"] for r in steady}, key=order.index)
    sizes = sorted({r["workers"] for r in steady})
    width = 0.8 / len(policies)
    for i, pol in enumerate(policies):
        xs = [j + (i - (len(policies) - 1) / 2) * width for j in range(len(sizes))]
        ys = [next(r["hit_rate"] for r in steady if r["policy"] == pol and r["workers"] == n)
              for n in sizes]  # fmt: skip
        ax1.bar(xs, ys, width, label=pol)
    ax1.axhline(0.95, color="gray", linestyle="--", linewidth=1)
    ax1.set_xticks(range(len(sizes)), [f"{n} workers" for n in sizes])
    ax1.set_ylim(0, 1)
    ax1.set_ylabel("prompt tokens served from cache")
    ax1.set_title("steady state", fontsize=10)
    ax1.legend(fontsize=8)
    for r in results:
        if "event" not in r:
            continue
        ts = [t + WINDOW_S / 2 for t, h in r["hit_rate_windows"] if h is not None]
        hs = [h for _, h in r["hit_rate_windows"] if h is not None]
        style = "-" if r["event"]["kind"] == "kill" else "--"
        ax2.plot(ts, hs, style, marker="o", label=f"{r['policy']} ({r['event']['kind']})")
    ax2.set_xlabel("seconds (worker killed / added at 60% of the run)")
    ax2.set_ylabel("hit rate per 2 s window")
    ax2.set_ylim(0, 1)
    ax2.set_title("worker killed (of 3) / added (to 2)", fontsize=10)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvgate bench cluster", description=__doc__)
    p.add_argument("--duration", type=float, default=30.0, help="seconds of load per run")
    p.add_argument("--rate", type=float, default=6.0, help="requests per second")
    p.add_argument("--system-blocks", type=int, default=64, help="system prompt length / 16")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--policies", default="kvgate,round_robin,tenant_hash")
    p.add_argument("--out", type=Path, default=RESULTS / "cluster.json")
    return p.parse_args(list(argv))


async def _all(args: argparse.Namespace, model_dir: Path) -> list[dict[str, Any]]:
    w = Workload(rate=args.rate, duration_s=args.duration, system_blocks=args.system_blocks)
    os.environ.update(KVGATE_KV_CACHE_BYTES=str(w.kv_cache_bytes), KVGATE_DEVICE="cpu")
    policies = args.policies.split(",")
    results = []

    def done(run: Run, scenario: str) -> None:
        r = summarize(run, w) | {"scenario": scenario}
        brief = {k: v for k, v in r.items() if k != "hit_rate_windows"}
        print(json.dumps(brief), flush=True)
        results.append(r)

    shared = start_workers(model_dir, ["w0", "w1", "w2"])
    try:
        for n in (2, 3):
            for policy in policies:
                done(
                    await run_policy(policy, model_dir, w, n, "steady", args.seed, shared), "steady"
                )
    finally:
        await stop_all(shared)
    for scenario in ("kill", "add"):
        for policy in policies:
            done(await run_policy(policy, model_dir, w, 3, scenario, args.seed), scenario)
    return results


def main(argv: Sequence[str]) -> int:
    from engine.model.demo import write_demo_model
    from gateway.settings import TelemetrySettings
    from gateway.telemetry import configure_logging

    args = _parse(argv)
    configure_logging(TelemetrySettings("warning", True, "kvgate-bench", None))
    w = Workload(rate=args.rate, duration_s=args.duration, system_blocks=args.system_blocks)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_demo_model(Path(tmp) / "demo-model")
        results = asyncio.run(_all(args, model_dir))
    rows = [
        [r["scenario"], r["workers"], r["policy"], r["requests"], r["errors"], r["hit_rate"],
         r["ttft_p50_ms"], r["ttft_p99_ms"], r.get("replacement_s"), r.get("hit_rate_min_after")]
        for r in results
    ]  # fmt: skip
    print_table(
        ["scenario", "workers", "policy", "requests", "errors", "hit rate", "TTFT p50 ms",
         "TTFT p99 ms", "re-placement s", "min hit after"], rows,
    )  # fmt: skip
    config = {
        "benchmark": "cluster",
        "workload": w.__dict__ | {"kv_cache_bytes": w.kv_cache_bytes},
        "pin_budget_blocks_per_worker": w.kv_cache_bytes // BLOCK_BYTES // 2,
        "system_prompt_blocks_total": w.tenants * w.system_blocks,
        "model": "demo (Qwen2 geometry: hidden 256, 4 layers, vocab 2000), cpu",
        "cpu_count": os.cpu_count(),
        "seed": args.seed,
    }
    write_json(args.out, {"config": config, "results": results})
    _plot(results, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0
