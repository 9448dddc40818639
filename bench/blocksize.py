"""``kvgate bench blocksize``: cache hit tokens and TTFT by KV block size (2..64).

Workload whose prompts are not block-aligned: a multi-turn conversation. Turn t's prompt is the
``--system-len``-token system prompt (301 by default), then every earlier turn (``--turn-len``
user tokens + the ``--output`` tokens generated for it), then the new user turn; turns run one
after the other, so each finds the previous prompt in the cache up to its last *full* block.
Smaller blocks match more of it (fewer tokens recomputed) at more per-block bookkeeping.
Reported per block size: hit tokens over turns 1..T, tokens the model computed, median TTFT of
turns 1..T (median over repeats, min-max spread), with one reuse-off run as the reference.
Times are CPU seconds of this process (one torch thread by default; the machines are shared).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.common import RESULTS_DIR, environment, model_dir, print_table, summarize, write_json
from bench.models import QWEN25_05B
from engine.params import SamplingParams
from engine.serving.engine import Engine

CPU = time.process_time


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvgate bench blocksize", description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--block-sizes", type=_ints, default=[2, 4, 8, 16, 32, 64])
    p.add_argument("--system-len", type=int, default=301)
    p.add_argument("--turn-len", type=int, default=37)
    p.add_argument("--turns", type=int, default=6, help="measured turns after the first")
    p.add_argument("--output", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "blocksize.json")
    return p.parse_args(list(argv))


def _conversation(eng: Engine, rng: random.Random, args: argparse.Namespace, ns: str) -> dict:
    params = SamplingParams(max_tokens=args.output, temperature=0.0, ignore_eos=True)
    history = [rng.randrange(10, 150_000) for _ in range(args.system_len)]
    ttft, hits, computed, prompt_tokens = [], [], [], 0
    for turn in range(args.turns + 1):
        prompt = history + [rng.randrange(10, 150_000) for _ in range(args.turn_len)]
        before = eng.num_model_tokens
        out = eng.generate([prompt], params, namespace=ns)[0]
        history = prompt + list(out.token_ids)
        if turn > 0:  # turn 0 fills the cold cache
            ttft.append(out.metrics.ttft)
            hits.append(out.num_cached_tokens)
            prompt_tokens += len(prompt)
            computed.append(eng.num_model_tokens - before)
    return {
        "ttft_median": statistics.median(ttft),
        "hit_tokens": sum(hits),
        "prompt_tokens": prompt_tokens,
        "model_tokens": sum(computed),
        "hits_per_turn": hits,
    }


def measure(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    path = model_dir(args.layers, args.model_dir)
    max_tokens = args.system_len + (args.turns + 1) * (args.turn_len + args.output) + 64
    engines: dict[str, Engine] = {}
    for bs in args.block_sizes:
        blocks = 2 * (-(-max_tokens // bs)) + 8
        kv = blocks * 2 * args.layers * bs * 128 * 4
        engines[f"bs{bs}"] = Engine.from_pretrained(
            path, block_size=bs, kv_cache_bytes=kv, device="cpu", dtype="float32", clock=CPU
        )
    ref_bs = 16 if 16 in args.block_sizes else args.block_sizes[0]
    engines["off"] = Engine.from_pretrained(
        path,
        block_size=ref_bs,
        enable_prefix_reuse=False,
        kv_cache_bytes=(2 * (-(-max_tokens // ref_bs)) + 8) * 2 * args.layers * ref_bs * 512,
        device="cpu",
        dtype="float32",
        clock=CPU,
    )
    raw: dict[str, list[dict[str, Any]]] = {name: [] for name in engines}
    warm = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    for eng in engines.values():
        eng.generate([[11] * 40], warm, namespace="warm-up")
    for rep in range(args.repeats):
        for name, eng in engines.items():
            rng = random.Random(1000 + rep)  # same conversation for every block size
            raw[name].append(_conversation(eng, rng, args, f"rep{rep}"))
        print(f"repeat {rep + 1}/{args.repeats} done", flush=True)
    return raw


def main(argv: Sequence[str]) -> int:
    args = _args(argv)
    torch.set_num_threads(args.threads)
    config = {
        "model": QWEN25_05B.describe(args.layers), "dtype": "float32",
        "block_sizes": args.block_sizes, "system_len": args.system_len,
        "turn_len": args.turn_len, "turns": args.turns, "output_tokens": args.output,
        "repeats": args.repeats, "timing": "process CPU time", **environment(args.threads),
    }  # fmt: skip
    print("config:", config, flush=True)
    raw = measure(args)
    rows = []
    for name, reps in raw.items():
        ttft = summarize([r["ttft_median"] for r in reps])
        rows.append({
            "config": name, "hit_tokens": reps[0]["hit_tokens"],
            "prompt_tokens": reps[0]["prompt_tokens"],
            "model_tokens": reps[0]["model_tokens"], "ttft_s": ttft,
            "hits_per_turn": reps[0]["hits_per_turn"],
        })  # fmt: skip
    print_table(
        ["config", "hit tokens", "model tokens", "TTFT median s", "min-max"],
        [[r["config"], r["hit_tokens"], r["model_tokens"], r["ttft_s"]["median"],
          f"{r['ttft_s']['min']:.3f}-{r['ttft_s']['max']:.3f}"] for r in rows],
    )  # fmt: skip
    write_json(args.out, {"benchmark": "blocksize", "config": config, "rows": rows, "raw": raw})
    from bench.plots import lines

    sized = [r for r in rows if r["config"] != "off"]
    off = next(r for r in rows if r["config"] == "off")
    lines(
        args.out.with_suffix(".png"),
        f"block size sweep, {args.turns}-turn conversation (reuse off TTFT "
        f"{off['ttft_s']['median']:.2f} s)",
        args.block_sizes,
        {"TTFT median (s)": [r["ttft_s"]["median"] for r in sized]},
        "block size (tokens)",
        "TTFT (s)",
        logx=True,
        right=("hit tokens", {"hit tokens": [r["hit_tokens"] for r in sized]}),
    )
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0
