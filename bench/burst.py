"""``kvgate bench burst``: TTFT of a cold-cache burst sharing one system prompt.

N requests arrive at once on an empty cache, each = one shared ``--system-len``-token system
prompt + its own ``--turn-len``-token user turn, ``--output`` tokens each. With early reuse the
first request computes the system prompt and the other N-1 read its blocks in the same step
(only their own turns go through the model); with reuse off every request computes everything.
Per repeat both modes run back to back; TTFT = first token time - arrival (all arrive together).
FLOP-ideal speed-up = prefill FLOPs without reuse / prefill FLOPs with early reuse. The engines
stamp times with this process's CPU clock (one torch thread by default): the machines here are
shared and wall time mostly measures other jobs; wall-clock totals are recorded in the JSON too.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.common import (
    RESULTS_DIR,
    environment,
    model_dir,
    percentile,
    prefill_flops,
    print_table,
    summarize,
    write_json,
)
from bench.models import QWEN25_05B
from engine.config import EngineConfig
from engine.params import SamplingParams
from engine.serving.engine import Engine


def _args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvgate bench burst", description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--system-len", type=int, default=1024)
    p.add_argument("--turn-len", type=int, default=32)
    p.add_argument("--output", type=int, default=8)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-batched-tokens", type=int, default=EngineConfig.max_num_batched_tokens)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "burst.json")
    return p.parse_args(list(argv))


def _burst(eng: Engine, prompts: list[list[int]], params: SamplingParams, ns: str) -> dict:
    tokens = eng.num_model_tokens
    w0, t0 = time.perf_counter(), time.process_time()
    ids = [eng.add_request(p, params, namespace=ns) for p in prompts]
    finals = {}
    while eng.has_unfinished():
        finals.update({o.request_id: o for o in eng.step() if o.finished})
    total, wall = time.process_time() - t0, time.perf_counter() - w0
    ttft = [finals[rid].metrics.ttft for rid in ids]
    return {
        "ttft_p50": percentile(ttft, 50),
        "ttft_p90": percentile(ttft, 90),
        "ttft_max": max(ttft),
        "total": total,
        "wall_total": wall,
        "model_tokens": eng.num_model_tokens - tokens,
        "cached": [finals[rid].num_cached_tokens for rid in ids],
    }


def measure(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    path = model_dir(args.layers, args.model_dir)
    prompt_len = args.system_len + args.turn_len
    blocks = args.requests * (-(-(prompt_len + args.output) // args.block_size)) + 64
    kw: dict[str, Any] = {
        "block_size": args.block_size,
        "device": "cpu",
        "dtype": "float32",
        "clock": time.process_time,
        "max_num_batched_tokens": args.max_batched_tokens,
        "kv_cache_bytes": blocks * 2 * args.layers * args.block_size * 128 * 4,
    }
    engines = {
        "early_reuse": Engine.from_pretrained(path, enable_prefix_reuse=True, **kw),
        "reuse_off": Engine.from_pretrained(path, enable_prefix_reuse=False, **kw),
    }
    params = SamplingParams(max_tokens=args.output, temperature=0.0, ignore_eos=True)
    rng = random.Random(0)
    for eng in engines.values():  # warm-up
        eng.generate([[rng.randrange(10, 150_000) for _ in range(64)]], params, namespace="w")
    raw: dict[str, list[dict[str, Any]]] = {name: [] for name in engines}
    for rep in range(args.repeats):
        system = [rng.randrange(10, 150_000) for _ in range(args.system_len)]
        prompts = [
            system + [rng.randrange(10, 150_000) for _ in range(args.turn_len)]
            for _ in range(args.requests)
        ]
        for name, eng in engines.items():
            raw[name].append(_burst(eng, prompts, params, f"rep{rep}"))
        print(f"repeat {rep + 1}/{args.repeats} done", flush=True)
    return raw


def main(argv: Sequence[str]) -> int:
    args = _args(argv)
    torch.set_num_threads(args.threads)
    prompt_len = args.system_len + args.turn_len
    config = {
        "model": QWEN25_05B.describe(args.layers), "dtype": "float32",
        "block_size": args.block_size, "requests": args.requests, "system_len": args.system_len,
        "turn_len": args.turn_len, "output_tokens": args.output, "repeats": args.repeats,
        "max_num_batched_tokens": args.max_batched_tokens, "timing": "process CPU time",
        **environment(args.threads),
    }  # fmt: skip
    print("config:", config, flush=True)
    raw = measure(args)
    on, off = raw["early_reuse"], raw["reuse_off"]
    # Prefill FLOPs from the cache hits the early-reuse run really had (first request: none).
    flops_on = sum(prefill_flops(c, prompt_len, args.layers) for c in on[0]["cached"])
    ideal = args.requests * prefill_flops(0, prompt_len, args.layers) / flops_on
    result: dict[str, Any] = {"flop_ideal_speedup": ideal}
    rows = []
    for key in ("ttft_p50", "ttft_p90", "total"):
        speedup = summarize([b[key] / a[key] for a, b in zip(on, off, strict=True)])
        result[key] = {
            "early_reuse_s": summarize([a[key] for a in on]),
            "reuse_off_s": summarize([b[key] for b in off]),
            "speedup": speedup,
        }
        rows.append([key, result[key]["early_reuse_s"]["median"],
                     result[key]["reuse_off_s"]["median"], speedup["median"],
                     f"{speedup['min']:.2f}-{speedup['max']:.2f}", ideal])  # fmt: skip
    result["model_tokens"] = {
        "early_reuse": on[0]["model_tokens"],
        "reuse_off": off[0]["model_tokens"],
    }
    print_table(
        ["metric", "early reuse s", "reuse off s", "speed-up", "min-max", "FLOP-ideal"], rows
    )
    print("model tokens:", result["model_tokens"])
    write_json(args.out, {"benchmark": "burst", "config": config, "result": result, "raw": raw})
    from bench.plots import grouped_bars

    grouped_bars(
        args.out.with_suffix(".png"),
        f"cold burst of {args.requests}, {args.system_len}-token system prompt: "
        f"TTFT (median of {args.repeats})",
        ["TTFT p50", "TTFT p90"],
        {
            "early reuse": [
                result["ttft_p50"]["early_reuse_s"]["median"],
                result["ttft_p90"]["early_reuse_s"]["median"],
            ],
            "reuse off": [
                result["ttft_p50"]["reuse_off_s"]["median"],
                result["ttft_p90"]["reuse_off_s"]["median"],
            ],
        },
        "seconds",
    )
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0
