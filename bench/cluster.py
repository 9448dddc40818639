"""``kvgate bench cluster``: routing quality of tenant placement across worker processes.

Workers on loopback with the demo model (a 2-core machine cannot show throughput scaling, so
this measures where prompts are found, not speed). 40 tenants with 1024-token system prompts whose
blocks together take ~3x one worker's pin budget, Zipf(1.1) tenant popularity, Poisson arrivals,
multi-turn conversations (a follow-up turn carries the earlier turns). Three policies run through
the same ``ClusterEngine`` (health checks, retries, pin reconciliation); they differ only in the
placement of pins and the routing of requests::

    kvgate        HRW placement, capacity-aware, replicas by load, tenants left unpinned
                  prefilled once where they are routed; affinity, least-loaded, spill
    round_robin   every worker pins tenants in id order until its budget is full (what each
                  engine does alone); requests go to the workers in turn
    tenant_hash   a tenant lives on worker hash(tenant) mod N (pinned there if it fits)

Hit rate: prompt tokens served from cache over the requests of the second half of a run (steady
state: the tenants' request rates, averaged over 12 s, have settled, and so has the placement that
follows them; ``hit_rate_with_warm_up`` counts every request, first sights of cold prompts too).

Scenarios: steady state with 2 and 3 workers; one worker of 3 killed; a third worker added to
2. Re-placement time: from the kill (or from the new worker first answering) until every tenant's
pins match the placement over the live workers. Hit-rate dip: the lowest prompt-cache hit rate
of a 2-second window after the event, against the mean of the windows before it (steady runs:
``hit_rate_min_window``, the lowest window of the measured half).

Seeds (``--seeds 1,2,3``): each seed fixes one request plan (bench/cluster_load.py) that every
policy is sent; the summary gives the mean and min-max over seeds. The uncached prompt tokens
split into first sights (no earlier request of the run had that prefix: only a pin made before
the run could serve it) and avoidable misses (an earlier request had it), the latter by route
reason; ``--trace DIR`` writes every request with its route, placement and pin holders.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from hashlib import blake2b
from pathlib import Path
from typing import Any

from bench.cluster_load import (
    BLOCK,
    BLOCK_BYTES,
    Sample,
    Workload,
    client_load,
    namespace,
    plan_digest,
    plan_requests,
    system_prompt,
)
from bench.common import percentile, print_table, write_json

RESULTS = Path(__file__).resolve().parent / "results"
TOKEN = "bench-cluster-token-0123456789abcdef"  # KVGATE_WORKER_TOKEN: 32+ characters
WINDOW_S = 2.0
WARM_UP = 0.5  # share of a run whose requests count only in hit_rate_with_warm_up
LOAD_WINDOW_S = 2.0  # tenant rate buckets: 6 of them (12 s) fill within the warm-up
EVENT_AT = 0.6  # share of a run after which a worker is killed or added


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
            from engine.remote.client import WorkerUnavailable

            raise WorkerUnavailable("no healthy worker")
        if policy == "round_robin":
            w = live[next(turn) % len(live)]
        else:
            w = live[_digest(key) % len(live)]
        return Route(healthy[w], policy)

    eng.placer.plan = plan
    eng.placer.warm_unplaced = False  # neither policy prefills the tenants it leaves unpinned
    eng._route = route  # the benchmark swaps the routing policy; production has one
    return eng


# -- one run -----------------------------------------------------------------------------------
@dataclass
class Run:
    policy: str
    workers: int
    seed: int
    samples: list[Sample] = field(default_factory=list)
    events: list[tuple[str, float]] = field(default_factory=list)
    replacement_s: float | None = None
    pin_moves: int = 0  # pins taken or released by reconciles during the load


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
    from gateway.cluster.local import LocalWorker

    # one compute thread per worker: several workers share this machine's two cores
    env = {**os.environ, "KVGATE_LOG_LEVEL": "warning", "OMP_NUM_THREADS": "1"}
    return LocalWorker.start_many(str(model_dir), ids, TOKEN, env, 120)


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
    run = Run(policy, n_workers, seed)
    try:
        await _drive(policy, model_dir, w, scenario, list(workers), run)
    finally:
        if shared is None:
            await stop_all(workers)
    return run


async def _drive(
    policy: str, model_dir: Path, w: Workload, scenario: str, workers: list, run: Run
) -> None:
    from gateway.cluster.bootstrap import fetch_bootstrap
    from gateway.cluster.engine import ClusterEngine
    from gateway.cluster.loadstats import LoadStats

    salt = f"{policy}-{scenario}-{len(workers)}-{run.seed}"
    info, payload = await fetch_bootstrap(tuple(x.url for x in workers), TOKEN, 10.0)
    eng = ClusterEngine(
        tuple(x.url for x in workers), TOKEN, tokenizer=payload.build(),
        info=info, health_s=0.5, load_stats=LoadStats(None, "", LOAD_WINDOW_S),
    )  # fmt: skip
    if policy != "kvgate":
        _baseline_engine(policy, eng)
    await eng.start()
    try:
        for t in range(w.tenants):
            await eng.pin(f"t{t}", namespace(t, salt), system_prompt(t, w.system_blocks))
        plan = plan_requests(w, run.seed)
        moves, t0 = eng.placer.moves, time.monotonic()
        load = asyncio.create_task(client_load(eng, w, plan, t0, run.samples, salt))
        await _scenario(eng, scenario, workers, model_dir, w, t0, run)
        await load
        run.pin_moves = eng.placer.moves - moves
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
        "seed": run.seed,
        "requests": len(run.samples),
        "errors": len(run.samples) - len(ok),
        "hit_rate": _share(warm, "cached"),
        "hit_rate_with_warm_up": _share(ok, "cached"),
        "ttft_p50_ms": percentile(ttft, 50) * 1e3 if ttft else None,
        "ttft_p99_ms": percentile(ttft, 99) * 1e3 if ttft else None,
    }
    out |= _misses(warm)
    out["pin_moves"] = run.pin_moves
    out["request_digest"] = plan_digest(run.samples)
    windows = _windows(ok, w.duration_s)
    out["hit_rate_windows"] = windows
    measured = [h for t, h in windows if t >= WARM_UP * w.duration_s and h is not None]
    out["hit_rate_min_window"] = min(measured) if measured else None
    if run.events:
        name, at = run.events[0]
        before = [h for t, h in windows if t + WINDOW_S <= at and h is not None]
        after = [h for t, h in windows if t >= at and h is not None]
        out["event"] = {"kind": name, "at_s": round(at, 2)}
        out["replacement_s"] = run.replacement_s
        out["hit_rate_before"] = statistics.mean(before) if before else None
        out["hit_rate_min_after"] = min(after) if after else None
    return out


def _share(samples: Sequence[Sample], attr: str) -> float:
    return sum(getattr(s, attr) for s in samples) / max(1, sum(s.prompt for s in samples))


def _misses(samples: Sequence[Sample]) -> dict[str, Any]:
    """Uncached prompt tokens of the measured requests (shares of their prompt tokens): first
    sights no policy could avoid, the avoidable rest, and the rest by route reason."""
    total = max(1, sum(s.prompt for s in samples))
    by_reason: dict[str, float] = {}
    for s in samples:
        if s.avoidable:
            reason = s.route.reason if s.route is not None else "unknown"
            by_reason[reason] = by_reason.get(reason, 0.0) + s.avoidable / total
    return {
        "miss_first_sight": _share(samples, "first_sight"),
        "miss_avoidable": _share(samples, "avoidable"),
        "requests_measured": len(samples),
        # more than the turn's own new tokens (which end in at most two partial blocks)
        "requests_first_sight": sum(1 for s in samples if s.first_sight > 2 * BLOCK),
        "requests_avoidable": sum(1 for s in samples if s.avoidable > 2 * BLOCK),
        "miss_avoidable_by_reason": dict(sorted(by_reason.items())),
    }


def _windows(samples: list[Sample], duration: float) -> list[tuple[float, float | None]]:
    out = []
    t = 0.0
    while t < duration:
        ws = [s for s in samples if t <= s.start < t + WINDOW_S]
        prompt = sum(s.prompt for s in ws)
        out.append((t, sum(s.cached for s in ws) / prompt if prompt else None))
        t += WINDOW_S
    return out


SPREAD = ("hit_rate", "ttft_p50_ms", "ttft_p99_ms", "replacement_s", "hit_rate_min_window",
          "hit_rate_min_after", "miss_first_sight", "miss_avoidable", "pin_moves")  # fmt: skip


def aggregate(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per scenario, worker count and policy: mean, min and max over the seeds."""
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["scenario"], r["workers"], r["policy"]), []).append(r)
    out = []
    for (scenario, workers, policy), runs in groups.items():
        row: dict[str, Any] = {"scenario": scenario, "workers": workers, "policy": policy,
                               "seeds": [r["seed"] for r in runs]}  # fmt: skip
        for name in SPREAD:
            values = [r[name] for r in runs if r.get(name) is not None]
            if values:
                row[name] = {"mean": statistics.mean(values), "min": min(values),
                             "max": max(values)}  # fmt: skip
        out.append(row)
    return out


def same_requests(results: Sequence[dict[str, Any]]) -> dict[str, bool]:
    """Per scenario and seed: did every policy send the same requests?"""
    digests: dict[str, set[str]] = {}
    for r in results:
        digests.setdefault(f"{r['scenario']}-{r['workers']}-seed{r['seed']}", set()).add(
            r["request_digest"]
        )
    return {k: len(v) == 1 for k, v in sorted(digests.items())}


def _write_trace(run: Run, scenario: str, folder: Path) -> None:
    """Every request of a run, with its route, one JSON object a line."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{scenario}-{run.workers}-{run.policy}-seed{run.seed}.jsonl"
    with path.open("w") as f:
        for s in sorted(run.samples, key=lambda s: s.start):
            row = {k: v for k, v in vars(s).items() if k != "route"}
            row |= {"first_sight": s.first_sight, "avoidable": s.avoidable}
            row["route"] = vars(s.route) if s.route is not None else None
            f.write(json.dumps(row) + "\n")


def _plot(results: list[dict[str, Any]], path: Path) -> None:
    from bench.plots import _pyplot

    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    summary = aggregate(results)
    steady = [r for r in summary if r["scenario"] == "steady"]
    order = ["kvgate", "round_robin", "tenant_hash"]
    policies = sorted({r["policy"] for r in steady}, key=order.index)
    sizes = sorted({r["workers"] for r in steady})
    width = 0.8 / len(policies)
    for i, pol in enumerate(policies):
        xs = [j + (i - (len(policies) - 1) / 2) * width for j in range(len(sizes))]
        hr = [next(r["hit_rate"] for r in steady if r["policy"] == pol and r["workers"] == n)
              for n in sizes]  # fmt: skip
        ys = [h["mean"] for h in hr]
        err = [[h["mean"] - h["min"] for h in hr], [h["max"] - h["mean"] for h in hr]]
        ax1.bar(xs, ys, width, yerr=err, capsize=3, label=pol)
    ax1.axhline(0.95, color="gray", linestyle="--", linewidth=1)
    ax1.set_xticks(range(len(sizes)), [f"{n} workers" for n in sizes])
    ax1.set_ylim(0, 1)
    ax1.set_ylabel("prompt tokens served from cache")
    seeds = sorted({r["seed"] for r in results})
    ax1.set_title(f"steady state (mean, min-max over seeds {seeds})", fontsize=10)
    ax1.legend(fontsize=8)
    for (kind, pol), runs in _event_runs(results).items():
        ts, hs = _mean_windows(runs)
        style = "-" if kind == "kill" else "--"
        ax2.plot(ts, hs, style, marker="o", label=f"{pol} ({kind})")
    ax2.set_xlabel("seconds (worker killed / added at 60% of the run)")
    ax2.set_ylabel("hit rate per 2 s window (mean over seeds)")
    ax2.set_ylim(0, 1)
    ax2.set_title("worker killed (of 3) / added (to 2)", fontsize=10)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _event_runs(results: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        if "event" in r:
            out.setdefault((r["event"]["kind"], r["policy"]), []).append(r)
    return out


def _mean_windows(runs: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    by_t: dict[float, list[float]] = {}
    for r in runs:
        for t, h in r["hit_rate_windows"]:
            if h is not None:
                by_t.setdefault(t, []).append(h)
    ts = sorted(by_t)
    return [t + WINDOW_S / 2 for t in ts], [statistics.mean(by_t[t]) for t in ts]


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvgate bench cluster", description=__doc__)
    p.add_argument("--duration", type=float, default=30.0, help="seconds of load per run")
    p.add_argument("--rate", type=float, default=6.0, help="requests per second")
    p.add_argument("--system-blocks", type=int, default=64, help="system prompt length / 16")
    p.add_argument("--seed", type=int, default=1, help="one seed (unless --seeds is given)")
    p.add_argument("--seeds", default=None, help="comma-separated seeds, e.g. 1,2,3")
    p.add_argument("--policies", default="kvgate,round_robin,tenant_hash")
    p.add_argument("--scenarios", default="steady,kill,add")
    p.add_argument("--workers", default="2,3", help="worker counts of the steady scenario")
    p.add_argument("--trace", type=Path, default=None, help="folder for per-request JSONL")
    p.add_argument("--out", type=Path, default=RESULTS / "cluster.json")
    args = p.parse_args(list(argv))
    args.seed_list = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
    return args


async def _all(args: argparse.Namespace, model_dir: Path) -> list[dict[str, Any]]:
    w = Workload(rate=args.rate, duration_s=args.duration, system_blocks=args.system_blocks)
    os.environ.update(KVGATE_KV_CACHE_BYTES=str(w.kv_cache_bytes), KVGATE_DEVICE="cpu")
    policies = args.policies.split(",")
    scenarios = args.scenarios.split(",")
    results = []

    def done(run: Run, scenario: str) -> None:
        r = summarize(run, w) | {"scenario": scenario}
        brief = {k: v for k, v in r.items() if k != "hit_rate_windows"}
        print(json.dumps(brief), flush=True)
        results.append(r)
        if args.trace is not None:
            _write_trace(run, scenario, args.trace)

    if "steady" in scenarios:
        sizes = [int(n) for n in args.workers.split(",")]
        shared = start_workers(model_dir, [f"w{i}" for i in range(max(sizes))])
        try:
            for seed in args.seed_list:
                for n in sizes:
                    for policy in policies:
                        run = await run_policy(policy, model_dir, w, n, "steady", seed, shared)
                        done(run, "steady")
        finally:
            await stop_all(shared)
    for seed in args.seed_list:
        for scenario in (s for s in ("kill", "add") if s in scenarios):
            for policy in policies:
                done(await run_policy(policy, model_dir, w, 3, scenario, seed), scenario)
    return results


def _fmt(cell: dict[str, float] | None, digits: int) -> str:
    if cell is None:
        return "-"
    return f"{cell['mean']:.{digits}f} ({cell['min']:.{digits}f}-{cell['max']:.{digits}f})"


def _print_summary(summary: list[dict[str, Any]]) -> None:
    rows = [
        [r["scenario"], r["workers"], r["policy"], _fmt(r.get("hit_rate"), 3),
         _fmt(r.get("miss_first_sight"), 3), _fmt(r.get("miss_avoidable"), 3),
         _fmt(r.get("ttft_p50_ms"), 1), _fmt(r.get("ttft_p99_ms"), 0),
         _fmt(r.get("replacement_s"), 2),
         _fmt(r.get("hit_rate_min_after") or r.get("hit_rate_min_window"), 2)]
        for r in summary
    ]  # fmt: skip
    print_table(
        ["scenario", "workers", "policy", "hit rate", "first sight", "avoidable", "TTFT p50 ms",
         "TTFT p99 ms", "re-placement s", "lowest 2 s"], rows,
    )  # fmt: skip


def main(argv: Sequence[str]) -> int:
    from engine.runtime.model.demo import write_demo_model
    from gateway.settings import TelemetrySettings
    from gateway.telemetry import configure_logging

    args = _parse(argv)
    configure_logging(TelemetrySettings("warning", True, "kvgate-bench", None))
    w = Workload(rate=args.rate, duration_s=args.duration, system_blocks=args.system_blocks)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_demo_model(Path(tmp) / "demo-model")
        results = asyncio.run(_all(args, model_dir))
    summary = aggregate(results)
    _print_summary(summary)
    config = {
        "benchmark": "cluster",
        "workload": w.__dict__ | {"kv_cache_bytes": w.kv_cache_bytes},
        "pin_budget_blocks_per_worker": w.kv_cache_bytes // BLOCK_BYTES // 2,
        "system_prompt_blocks_total": w.tenants * w.system_blocks,
        "model": "demo (Qwen2 geometry: hidden 256, 4 layers, vocab 2000), cpu",
        "cpu_count": os.cpu_count(),
        "seed": args.seed_list[0],
        "seeds": args.seed_list,
        "same_requests_across_policies": same_requests(results),
    }
    write_json(args.out, {"config": config, "results": results, "summary": summary})
    _plot(results, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0
