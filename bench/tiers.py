"""``kvgate bench tiers``: the host KV tier and warm restarts from disk.

Three measurements on one random-weight model (Qwen2.5-0.5B geometry, ``--layers`` layers, CPU,
float32), each reported as a ratio:

1. ``traffic``: ``--tenants`` tenants whose system prompts hold 5x the device pin budget, all
   pinned at start (beyond the cap: pinned in the host tier, or refused without one); requests
   pick a tenant by Zipf popularity and arrive as a Poisson process. TTFT p50 / p99 and the share
   of prompt tokens served from the cache, with the host tier vs without.
2. ``restore``: a ``--restore-len``-token prompt answered (1 token) after its blocks were
   offloaded to the host tier, vs recomputed from scratch.
3. ``warm start``: ``--warm-tenants`` pinned prompts restored from disk snapshots at start vs
   computed.

Times are this process's CPU seconds (one torch thread by default; the machines here are shared,
wall time mostly measures other jobs); arrivals and TTFTs run on that clock too. Wall-clock
seconds are in the JSON as well.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.common import RESULTS_DIR, environment, model_dir, percentile, print_table, write_json
from bench.models import QWEN25_05B
from engine.api import GenerateOptions
from engine.params import SamplingParams
from engine.serving.engine import Engine

VOCAB_LO, VOCAB_HI = 10, 150_000
BLOCK_BYTES_PER_LAYER = 2 * 16 * QWEN25_05B.kv_heads * QWEN25_05B.head_dim * 4  # block of 16


def _args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvgate bench tiers", description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tenants", type=int, default=40)
    p.add_argument("--prompt-len", type=int, default=256, help="tenant system prompt tokens")
    p.add_argument("--device-blocks", type=int, default=256, help="device pool (blocks of 16)")
    p.add_argument("--requests", type=int, default=80)
    p.add_argument("--rate", type=float, default=2.0, help="Poisson arrivals per CPU second")
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--restore-len", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warm-tenants", type=int, default=50)
    p.add_argument("--warm-len", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "tiers.json")
    return p.parse_args(list(argv))


class SimClock:
    """CPU seconds of this process, plus the idle gaps skipped between Poisson arrivals."""

    def __init__(self) -> None:
        self.skipped = 0.0

    def __call__(self) -> float:
        return time.process_time() + self.skipped

    def jump_to(self, at: float) -> None:
        self.skipped += max(0.0, at - self())


def _engine(path: Path, layers: int, blocks: int, host_blocks: int, **kw: Any) -> Engine:
    per_block = layers * BLOCK_BYTES_PER_LAYER
    return Engine.from_pretrained(
        path,
        block_size=16,
        device="cpu",
        dtype="float32",
        kv_cache_bytes=blocks * per_block,
        host_kv_bytes=host_blocks * per_block,
        **{"clock": time.process_time, **kw},
    )


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(n)]


# ---------------------------------------------------------------------------------- traffic


def _traffic(args: argparse.Namespace, path: Path, host: bool) -> dict[str, Any]:
    rng = random.Random(args.seed)
    prompts = [_tokens(rng, args.prompt_len) for _ in range(args.tenants)]
    host_blocks = args.tenants * args.prompt_len // 16 + 64 if host else 0
    clock = SimClock()
    eng = _engine(
        path, args.layers, args.device_blocks, host_blocks, pin_cap_fraction=0.5, clock=clock
    )
    tiers = {"device": 0, "host": 0, "refused": 0}
    for t, prompt in enumerate(prompts):
        try:
            tiers[eng.pin_prefix(f"t{t}", prompt).tier] += 1
        except Exception:  # PinRejected: beyond the device cap without a host tier
            tiers["refused"] += 1
    weights = [1.0 / (k + 1) ** args.zipf for k in range(args.tenants)]
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    start = eng.core.clock()
    arrivals, at = [], start
    for _ in range(args.requests):
        at += rng.expovariate(args.rate)
        t = rng.choices(range(args.tenants), weights)[0]
        arrivals.append((at, t, [*prompts[t], *_tokens(rng, 16)]))
    before = eng.cache_stats()
    ttft, cached, query = _serve(eng, clock, arrivals, params)
    after = eng.cache_stats()
    return {
        "host_tier": host,
        "pins": tiers,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "cached_prompt_tokens": cached,
        "prompt_tokens": query,
        "cached_share": cached / query,
        "host_hit_tokens": after.host_hit_tokens - before.host_hit_tokens,
        "blocks_restored": after.blocks_restored - before.blocks_restored,
        "blocks_offloaded": after.blocks_offloaded - before.blocks_offloaded,
    }


def _serve(
    eng: Engine,
    clock: SimClock,
    arrivals: list[tuple[float, int, list[int]]],
    params: SamplingParams,
) -> tuple[list[float], int, int]:
    pending = list(arrivals)
    ttft: list[float] = []
    cached = query = 0
    while pending or eng.has_unfinished():
        now = eng.core.clock()
        while pending and pending[0][0] <= now:
            at, t, ids = pending.pop(0)
            eng.core.add_request(ids, params, GenerateOptions(f"t{t}"), arrival_time=at)
        if not eng.has_unfinished():
            clock.jump_to(pending[0][0])  # idle until the next arrival
            continue
        for out in eng.step():
            if out.finished:
                m = out.metrics
                ttft.append(m.first_token_time - m.arrival_time)  # type: ignore[operator]
                cached += out.num_cached_tokens
                query += out.num_prompt_tokens
    return ttft, cached, query


# ---------------------------------------------------------------------------------- restore


def _restore(args: argparse.Namespace, path: Path) -> dict[str, Any]:
    rng = random.Random(args.seed + 1)
    n = args.restore_len
    blocks = n // 16 + 8
    eng = _engine(path, args.layers, blocks, blocks)
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    recompute, restore, copy_us = [], [], []
    for r in range(args.repeats):
        prompt = _tokens(rng, n)
        t0 = time.process_time()
        eng.generate([prompt], one, namespace=f"r{r}")
        recompute.append(time.process_time() - t0)
        eng.cache.evict(blocks)  # offloaded to the host tier
        eng.core.flush_transfers()
        before = eng.cache_stats()
        t0 = time.process_time()
        out = eng.generate([prompt], one, namespace=f"r{r}")[0]
        restore.append(time.process_time() - t0)
        after = eng.cache_stats()
        assert out.num_cached_tokens == (n - 1) // 16 * 16
        copy_us.append(after.transfer_us - before.transfer_us)
    rec, res = sorted(recompute)[len(recompute) // 2], sorted(restore)[len(restore) // 2]
    return {
        "prompt_tokens": n,
        "recompute_s": rec,
        "restore_s": res,
        "copy_in_s": sorted(copy_us)[len(copy_us) // 2] / 1e6,
        "bytes_per_block": eng.cache_stats().bytes_restored // max(1, after.blocks_restored),
        "ratio": rec / res,
    }


# ---------------------------------------------------------------------------------- warm start


def _warm_start(args: argparse.Namespace, path: Path) -> dict[str, Any]:
    rng = random.Random(args.seed + 2)
    prompts = [_tokens(rng, args.warm_len) for _ in range(args.warm_tenants)]
    blocks = args.warm_tenants * (args.warm_len // 16 + 1) * 2 + 64
    snap = Path(tempfile.mkdtemp(prefix="kvgate-bench-snap-"))
    try:
        cold = _start(path, args.layers, blocks, snap, prompts)
        cold["engine"].core.snapshots.flush()
        warm = _start(path, args.layers, blocks, snap, prompts)
        assert warm["engine"].core.snapshots.restored == len(prompts)
        assert warm["engine"].num_model_tokens == 0
    finally:
        shutil.rmtree(snap, ignore_errors=True)
    return {
        "tenants": len(prompts),
        "prompt_tokens": args.warm_len,
        "recompute_start_s": cold["start_s"],
        "recompute_pin_s": cold["pin_s"],
        "restore_start_s": warm["start_s"],
        "restore_pin_s": warm["pin_s"],
        "ratio_pin": cold["pin_s"] / warm["pin_s"],
        "ratio_start": cold["start_s"] / warm["start_s"],
    }


def _start(
    path: Path, layers: int, blocks: int, snap: Path, prompts: list[list[int]]
) -> dict[str, Any]:
    t0 = time.process_time()
    eng = _engine(path, layers, blocks, 0, kv_snapshot_dir=str(snap), pin_cap_fraction=1.0)
    t1 = time.process_time()
    for t, prompt in enumerate(prompts):
        eng.pin_prefix(f"w{t}", prompt)
    t2 = time.process_time()
    return {"engine": eng, "start_s": t2 - t0, "pin_s": t2 - t1}


# ---------------------------------------------------------------------------------- main


def main(argv: Sequence[str]) -> int:
    args = _args(argv)
    torch.set_num_threads(args.threads)
    path = model_dir(args.layers, args.model_dir)
    wall = time.perf_counter()
    traffic = {"host": _traffic(args, path, True), "none": _traffic(args, path, False)}
    restore = _restore(args, path)
    warm = _warm_start(args, path)
    ratios = {
        "ttft_p50_no_host_over_host": traffic["none"]["ttft_p50_s"] / traffic["host"]["ttft_p50_s"],
        "ttft_p99_no_host_over_host": traffic["none"]["ttft_p99_s"] / traffic["host"]["ttft_p99_s"],
        "restore_2k_recompute_over_restore": restore["ratio"],
        "warm_start_recompute_over_restore": warm["ratio_start"],
    }
    print_table(
        ["traffic", "TTFT p50 s", "TTFT p99 s", "cached share", "pins dev/host/refused"],
        [
            [name, r["ttft_p50_s"], r["ttft_p99_s"], r["cached_share"],
             "/".join(str(r["pins"][k]) for k in ("device", "host", "refused"))]
            for name, r in traffic.items()
        ],
    )  # fmt: skip
    print_table(["ratio", "value"], [[k, v] for k, v in ratios.items()])
    payload = {
        "benchmark": "tiers",
        "environment": environment(args.threads),
        "args": {k: str(v) for k, v in vars(args).items()},
        "traffic": traffic,
        "restore": restore,
        "warm_start": warm,
        "ratios": ratios,
        "wall_s": time.perf_counter() - wall,
    }
    write_json(args.out, payload)
    _plot(args.out.with_suffix(".png"), traffic, restore, warm)
    return 0


def _plot(path: Path, traffic: dict, restore: dict, warm: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 4))
    ax = axes[0]
    xs = range(2)
    for i, (name, label) in enumerate((("host", "host tier"), ("none", "no host tier"))):
        r = traffic[name]
        ax.bar([x + (i - 0.5) * 0.4 for x in xs], [r["ttft_p50_s"], r["ttft_p99_s"]], 0.4,
               label=f"{label} ({r['cached_share']:.0%} cached)")  # fmt: skip
    ax.set_xticks(list(xs), ["TTFT p50", "TTFT p99"])
    ax.set_ylabel("CPU seconds")
    ax.set_title("Zipf tenants, 5x the pin budget", fontsize=10)
    ax.legend(fontsize=8)
    ax = axes[1]
    ax.bar(["recompute", "restore (host)"], [restore["recompute_s"], restore["restore_s"]])
    ax.set_title(f"{restore['prompt_tokens']}-token prompt: x{restore['ratio']:.1f}", fontsize=10)
    ax = axes[2]
    ax.bar(["recompute", "from disk"], [warm["recompute_start_s"], warm["restore_start_s"]])
    ax.set_title(f"start with {warm['tenants']} pinned tenants: x{warm['ratio_start']:.1f}",
                 fontsize=10)  # fmt: skip
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
