"""``kvgate bench reuse``: prefix reuse on vs off by batch size and common-prefix length.

Workload (the public TensorRT-LLM comparison): prompts of ``--prompt-len`` tokens, 1 output token,
batch 1 and 7, the first P tokens common to the batch. Per repeat, side by side on one model:

- ``off``: reuse disabled, measured back to back with every reuse measurement (its own twin);
- ``cold``: reuse on, empty cache: the batch arrives together, one request computes the common
  blocks and the others read them in the same step (early reuse);
- ``warm``: reuse on, the common prefix computed by an earlier request (not timed).

A fresh cache namespace per measurement keeps runs independent. Ratio = time(reuse) / time(off);
ideal = FLOPs of the uncached tokens / FLOPs of the whole batch (bench/common.py). Times are CPU
seconds of this process (one torch thread by default): the machines here are shared, and wall
time mostly measures other jobs; wall-clock ratios are recorded in the JSON too.

FLOPs do not price the fixed cost of a request: sampling one token reads the whole float32
embedding/LM head (vocab x hidden = 545 MB for this geometry, memory-bound) and walks Python once.
It is measured per step as the cost of a 1-token prompt (every measured batch runs in one step);
``ideal+fixed`` = (fixed + F_reuse / R) / time_off, F = FLOPs without that first logits row and R
the FLOP rate of the off run after its fixed cost: the best a scheduler can do on this runner.
It explains the gap where little is left to compute (batch 1, long prefixes).
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
    prefill_flops,
    print_table,
    summarize,
    write_json,
)
from bench.models import QWEN25_05B
from engine.params import SamplingParams
from engine.serving.engine import Engine

ONE_TOKEN = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
VOCAB_LO, VOCAB_HI = 10, 150_000


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvgate bench reuse", description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--prompt-len", type=int, default=384)
    p.add_argument("--batches", type=_ints, default=[1, 7])
    p.add_argument("--prefixes", type=_ints, default=[0, 128, 256, 383])
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "reuse.json")
    return p.parse_args(list(argv))


class _Run:
    def __init__(self, args: argparse.Namespace) -> None:
        path = model_dir(args.layers, args.model_dir)
        kw: dict[str, Any] = {"block_size": args.block_size, "device": "cpu", "dtype": "float32"}
        kw["kv_cache_bytes"] = 2 * args.layers * 1024 * 16 * 128 * 4  # 1024 blocks of 16
        self.on = Engine.from_pretrained(path, enable_prefix_reuse=True, **kw)
        self.off = Engine.from_pretrained(path, enable_prefix_reuse=False, **kw)
        self.args = args
        self.ns = 0

    def _namespace(self) -> str:
        self.ns += 1
        return f"m{self.ns}"

    def timed(self, eng: Engine, prompts: list[list[int]], warm: list[int] | None) -> tuple:
        ns = self._namespace()
        if warm:
            eng.generate([warm], ONE_TOKEN, namespace=ns)
        tokens = eng.num_model_tokens
        w0, t0 = time.perf_counter(), time.process_time()
        outs = eng.generate(prompts, ONE_TOKEN, namespace=ns)
        dt, wall = time.process_time() - t0, time.perf_counter() - w0
        return dt, wall, [o.num_cached_tokens for o in outs], eng.num_model_tokens - tokens


def _prompts(rng: random.Random, batch: int, length: int, prefix: int) -> list[list[int]]:
    common = [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(prefix)]
    return [common + [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(length - prefix)]
            for _ in range(batch)]  # fmt: skip


def _configs(args: argparse.Namespace) -> list[tuple[int, int, str]]:
    out = []
    for b in args.batches:
        for p in args.prefixes:
            if b > 1 or p == 0:  # batch 1 cold has nothing to share: same as prefix 0
                out.append((b, p, "cold"))
            if p > 0:
                out.append((b, p, "warm"))
    return out


def _pair(run: _Run, args: argparse.Namespace, rng: random.Random, cfg: tuple, rep: int) -> dict:
    """One reuse measurement and its own reuse-off twin, back to back (order alternating by
    repeat so that drift of the shared machine does not favour either side)."""
    b, p, mode = cfg
    length, layers = args.prompt_len, args.layers
    prompts = _prompts(rng, b, length, p)
    warm = prompts[0][:p] if mode == "warm" else None
    off_prompts = _prompts(rng, b, length, 0)
    if rep % 2:
        dt, wall, cached, tokens = run.timed(run.on, prompts, warm)
        t_off, w_off, _, _ = run.timed(run.off, off_prompts, None)
    else:
        t_off, w_off, _, _ = run.timed(run.off, off_prompts, None)
        dt, wall, cached, tokens = run.timed(run.on, prompts, warm)
    fixed, _, _, _ = run.timed(run.on, _prompts(rng, 1, 1, 0), None)
    lm_rows = (b - 1) * 2 * QWEN25_05B.hidden * QWEN25_05B.vocab  # logits beyond the first row
    rate = (b * prefill_flops(0, length, layers, sampled=0) + lm_rows) / max(t_off - fixed, 1e-9)
    bare = sum(prefill_flops(c, length, layers, sampled=0) for c in cached) + lm_rows
    flops_on = sum(prefill_flops(c, length, layers) for c in cached)
    return {
        "time": dt, "off": t_off, "ratio": dt / t_off,
        "ideal": flops_on / (b * prefill_flops(0, length, layers)),
        "ideal_fixed": (fixed + bare / rate) / t_off, "fixed": fixed,
        "wall": wall, "wall_off": w_off, "wall_ratio": wall / w_off,
        "cached": cached, "model_tokens": tokens,
    }  # fmt: skip


def measure(args: argparse.Namespace) -> dict[str, Any]:
    run = _Run(args)
    rng = random.Random(0)
    run.timed(run.on, _prompts(rng, 2, args.prompt_len, 0), None)  # warm-up both engines
    run.timed(run.off, _prompts(rng, 2, args.prompt_len, 0), None)
    raw: dict[str, list[dict[str, Any]]] = {}
    for rep in range(args.repeats):
        for cfg in _configs(args):
            raw.setdefault("{}/{}/{}".format(*cfg), []).append(_pair(run, args, rng, cfg, rep))
        print(f"repeat {rep + 1}/{args.repeats} done", flush=True)
    return raw


def tabulate(args: argparse.Namespace, raw: dict[str, list[dict[str, Any]]]) -> list[dict]:
    rows = []
    for b, p, mode in _configs(args):
        reps = raw[f"{b}/{p}/{mode}"]
        ratio = summarize([r["ratio"] for r in reps])
        ideal = reps[0]["ideal"]
        rows.append({
            "batch": b, "prefix": p, "mode": mode,
            "cached_tokens_per_request": reps[0]["cached"],
            "model_tokens": reps[0]["model_tokens"],
            "time_reuse_s": summarize([r["time"] for r in reps]),
            "time_off_s": summarize([r["off"] for r in reps]),
            "ratio": ratio, "ideal_ratio": ideal,
            "wall_ratio": summarize([r["wall_ratio"] for r in reps]),
            "measured_over_ideal": ratio["median"] / ideal,
            "ideal_plus_fixed": summarize([r["ideal_fixed"] for r in reps]),
            "fixed_cost_s": summarize([r["fixed"] for r in reps]),
        })  # fmt: skip
    return rows


def _plot(path: Path, rows: list[dict], title: str) -> None:
    from bench.plots import grouped_bars

    groups = [f"b{r['batch']} p{r['prefix']}\n{r['mode']}" for r in rows]
    grouped_bars(
        path,
        title,
        groups,
        {
            "measured (reuse/off)": [r["ratio"]["median"] for r in rows],
            "FLOP-ideal": [r["ideal_ratio"] for r in rows],
        },
        "time ratio reuse / off",
        errors={
            "measured (reuse/off)": (
                [r["ratio"]["min"] for r in rows],
                [r["ratio"]["max"] for r in rows],
            )
        },
        hline=1.0,
    )


def main(argv: Sequence[str]) -> int:
    args = _args(argv)
    torch.set_num_threads(args.threads)
    config = {
        "model": QWEN25_05B.describe(args.layers), "dtype": "float32",
        "block_size": args.block_size, "prompt_len": args.prompt_len, "output_tokens": 1,
        "batches": args.batches, "prefixes": args.prefixes, "repeats": args.repeats,
        "max_num_batched_tokens": 8192, "timing": "process CPU time",
        **environment(args.threads),
    }  # fmt: skip
    print("config:", config, flush=True)
    raw = measure(args)
    rows = tabulate(args, raw)
    print_table(
        ["batch", "prefix", "mode", "cached/req", "reuse s", "off s", "ratio", "min-max",
         "ideal", "meas/ideal", "ideal+fixed", "wall ratio"],
        [[r["batch"], r["prefix"], r["mode"], r["cached_tokens_per_request"][-1],
          r["time_reuse_s"]["median"], r["time_off_s"]["median"], r["ratio"]["median"],
          f"{r['ratio']['min']:.3f}-{r['ratio']['max']:.3f}", r["ideal_ratio"],
          r["measured_over_ideal"], r["ideal_plus_fixed"]["median"],
          r["wall_ratio"]["median"]] for r in rows],
    )  # fmt: skip
    write_json(args.out, {"benchmark": "reuse", "config": config, "rows": rows, "raw": raw})
    _plot(args.out.with_suffix(".png"), rows, "prefix reuse vs off: " + config["model"])
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0
