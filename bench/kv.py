"""``kvgate bench kv``: prefix-cache cost on a warm pool, and scheduler-style churn per step.

Admission: a 4,096-token prompt whose first ``--hit-fraction`` is cached, against a pool of
``--num-blocks`` blocks entirely filled with cached chains (so every admission also evicts).
Timed per admission: ``allocate`` (hash every full block, match, attach, take/evict blocks,
register PENDING); also ``lookup`` alone, a cold admission (nothing cached) and an admission
with reuse disabled, side by side. Untimed between iterations: commit + free, so the pool stays
full and the next prompt (new suffix) evicts again.

Churn: ``--running`` requests decode one token per step (allocate + pending_deps + commit each);
a request finishing after its output length is freed and a new one admitted (shared system
prompt per tenant, so admissions hit). Reports microseconds per step.

Pure Python (engine.core.kv imports no torch); GC is disabled inside timed loops.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, environment, print_table, summarize, write_json
from engine.core.kv import PrefixCache

PROMPT_TOKENS = 4096
VOCAB = 151_936


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvgate bench kv", description=__doc__.splitlines()[0])
    p.add_argument("--block-sizes", default="16,2", help="comma-separated, powers of two")
    p.add_argument("--num-blocks", type=int, default=100_000)
    p.add_argument("--prompt-tokens", type=int, default=PROMPT_TOKENS)
    p.add_argument("--hit-fraction", type=float, default=0.875, help="cached share of the prompt")
    p.add_argument("--iters", type=int, default=20, help="admissions timed per repeat")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--running", type=int, default=64, help="running requests in the churn")
    p.add_argument("--steps", type=int, default=200, help="churn steps per repeat")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(RESULTS_DIR / "kv.json"))
    return p.parse_args(list(argv))


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


def _fill(cache: PrefixCache, rng: random.Random, prompt_tokens: int) -> list[list[int]]:
    """Cache distinct chains until no free (EMPTY) block is left; returns their prompts."""
    chains: list[list[int]] = []
    while cache.pool.free:
        n = min(prompt_tokens, len(cache.pool.free) * cache.block_size)
        tokens = _tokens(rng, n)
        rid = f"fill{len(chains)}"
        cache.allocate(rid, f"tenant{len(chains) % 8}", tokens)
        cache.commit(rid, n)
        cache.free(rid)
        chains.append(tokens)
    return chains


def _time_ms(
    fn: Callable[[int], Any], iters: int, between: Callable[[int], Any]
) -> tuple[float, float]:
    """Median wall and thread-CPU time of ``fn(i)`` in ms; ``between(i)`` runs untimed after it.

    CPU time excludes the time the thread waits descheduled on a shared, loaded machine.
    """
    wall, cpu = [], []
    gc.disable()
    try:
        for i in range(iters):
            c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
            fn(i)
            wall.append((time.perf_counter_ns() - t0) / 1e6)
            cpu.append((time.thread_time_ns() - c0) / 1e6)
            between(i)
    finally:
        gc.enable()
    return statistics.median(wall), statistics.median(cpu)


def bench_admission(args: argparse.Namespace, block_size: int) -> dict[str, Any]:
    rng = random.Random(args.seed)
    warm = PrefixCache(args.num_blocks, block_size)
    off = PrefixCache(args.num_blocks, block_size, enable_reuse=False)
    t0 = time.perf_counter()
    chains = _fill(warm, rng, args.prompt_tokens)
    fill_s = time.perf_counter() - t0
    hit = int(args.prompt_tokens * args.hit_fraction) // block_size * block_size
    full_chains = [c for c in chains if len(c) == args.prompt_tokens]
    assert full_chains, "pool too small for one full prompt chain"
    counter = iter(range(10**9))

    def prompt(i: int) -> tuple[str, list[int]]:
        k = i % len(full_chains)
        return f"tenant{k % 8}", full_chains[k][:hit] + _tokens(rng, args.prompt_tokens - hit)

    def settle(cache: PrefixCache, rid: str) -> None:
        cache.commit(rid, args.prompt_tokens)
        cache.free(rid)

    names = ("allocate", "lookup", "cold", "no_reuse")
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    hits: list[int] = []
    for _ in range(args.repeats):
        prompts = [prompt(i) for i in range(args.iters)]
        cold = [(ns, _tokens(rng, args.prompt_tokens)) for ns, _ in prompts]
        rids = [f"r{next(counter)}" for _ in range(args.iters)]
        rids_cold = [f"c{next(counter)}" for _ in range(args.iters)]

        def admit(i: int, p: list = prompts, r: list = rids) -> None:
            alloc = warm.allocate(r[i], *p[i])
            assert alloc is not None
            hits.append(alloc.num_cached_tokens)

        ops: dict[str, tuple[Callable[[int], Any], Callable[[int], Any]]] = {
            "allocate": (admit, lambda i, r=rids: settle(warm, r[i])),
            "lookup": (lambda i, p=prompts: warm.lookup(*p[i]), lambda i: None),
            "cold": (
                lambda i, c=cold, r=rids_cold: warm.allocate(r[i], *c[i]),
                lambda i, r=rids_cold: settle(warm, r[i]),
            ),
            "no_reuse": (
                lambda i, p=prompts, r=rids: off.allocate(r[i], *p[i]),
                lambda i, r=rids: off.free(r[i]),
            ),
        }
        for name, (fn, between) in ops.items():
            w, c = _time_ms(fn, args.iters, between)
            wall[name].append(w)
            cpu[name].append(c)
        if args.num_blocks <= 20_000:  # full check is O(pool); skip on the big pool
            warm.check_integrity()
    stats = warm.stats()
    return {
        "block_size": block_size,
        "fill_seconds": round(fill_s, 2),
        "cached_chains": len(chains),
        "hit_tokens_expected": hit,
        "hit_tokens_median": sorted(hits)[len(hits) // 2],
        "wall_ms": {name: summarize(values) for name, values in wall.items()},
        "cpu_ms": {name: summarize(values) for name, values in cpu.items()},
        "evictions": stats.evictions,
        "blocks_cached_after": stats.blocks_cached,
    }


def bench_churn(args: argparse.Namespace, block_size: int) -> dict[str, Any]:
    rng = random.Random(args.seed + 1)
    cache = PrefixCache(args.num_blocks, block_size)
    systems = {f"tenant{t}": _tokens(rng, 512) for t in range(8)}
    running: dict[str, tuple[str, list[int], int]] = {}  # rid -> (ns, tokens, output budget)
    ids = iter(range(10**9))

    def admit() -> None:
        ns = rng.choice(sorted(systems))
        tokens = systems[ns] + _tokens(rng, rng.randrange(16, 256))
        rid = f"q{next(ids)}"
        alloc = cache.allocate(rid, ns, tokens)
        assert alloc is not None, "churn pool too small"
        cache.commit(rid, len(tokens))
        running[rid] = (ns, tokens, len(tokens) + rng.randrange(32, 256))

    for _ in range(args.running):
        admit()
    step_wall: list[float] = []
    step_cpu: list[float] = []
    finished = 0
    for _ in range(args.repeats):
        wall, cpu = [], []
        gc.disable()
        try:
            for _ in range(args.steps):
                c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
                for rid, (ns, tokens, budget) in list(running.items()):
                    tokens.append(rng.randrange(VOCAB))
                    cache.allocate(rid, ns, tokens)
                    cache.pending_deps(rid)
                    cache.commit(rid, len(tokens))
                    if len(tokens) >= budget:
                        cache.free(rid)
                        del running[rid]
                        finished += 1
                        admit()
                wall.append((time.perf_counter_ns() - t0) / 1e3)
                cpu.append((time.thread_time_ns() - c0) / 1e3)
        finally:
            gc.enable()
        step_wall.append(statistics.median(wall))
        step_cpu.append(statistics.median(cpu))
    cache.check_integrity()
    stats = cache.stats()
    return {
        "block_size": block_size,
        "running": args.running,
        "steps_per_repeat": args.steps,
        "finished": finished,
        "wall_us_per_step": summarize(step_wall),
        "cpu_us_per_step": summarize(step_cpu),
        "hit_rate": round(stats.hit_rate, 3),
    }


def _span(d: dict[str, float], fmt: str = ".3f") -> str:
    return f"{d['median']:{fmt}} [{d['min']:{fmt}}-{d['max']:{fmt}}]"


def _print(admissions: list[dict[str, Any]], churns: list[dict[str, Any]], running: int) -> None:
    rows = []
    for a, c in zip(admissions, churns, strict=True):
        for timer in ("wall", "cpu"):
            ms = a[f"{timer}_ms"]
            ratio = ms["allocate"]["median"] / ms["no_reuse"]["median"]
            rows.append(
                [a["block_size"], timer, a["hit_tokens_median"]]
                + [_span(ms[k]) for k in ("allocate", "lookup", "cold", "no_reuse")]
                + [f"{ratio:.1f}", _span(c[f"{timer}_us_per_step"], ".0f")]
            )
    headers = ["bs", "timer", "hit tok", "allocate ms", "lookup ms", "cold allocate ms"]
    headers += ["no-reuse ms", "alloc/no-reuse", f"churn us/step ({running} req)"]
    print_table(headers, rows)


def main(argv: Sequence[str]) -> int:
    args = _parse(argv)
    sizes = [int(s) for s in args.block_sizes.split(",") if s]
    print(
        f"kv bench: pool {args.num_blocks} blocks, prompt {args.prompt_tokens} tokens "
        f"({args.hit_fraction:.0%} cached), block sizes {sizes}, {args.iters} admissions x "
        f"{args.repeats} repeats; churn {args.running} running x {args.steps} steps x "
        f"{args.repeats} repeats; medians of per-repeat medians [min-max]"
    )
    load_before = os.getloadavg()
    admissions, churns = [], []
    for bs in sizes:
        admissions.append(bench_admission(args, bs))
        churns.append(bench_churn(args, bs))
    _print(admissions, churns, args.running)
    print(f"load average before/after: {load_before[0]:.2f} / {os.getloadavg()[0]:.2f}")
    payload = {
        "benchmark": "kv",
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "environment": {
            **environment(threads=1),
            "loadavg_1m_before": load_before[0],
            "loadavg_1m_after": os.getloadavg()[0],
            "timers": "wall: perf_counter; cpu: thread_time (excludes descheduled time)",
        },
        "admission": admissions,
        "churn": churns,
        "targets_ms": {"16": 1.0, "2": 5.0},
    }
    write_json(Path(args.out), payload)
    print(f"wrote {args.out}")
    return 0
