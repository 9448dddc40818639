"""``kvgate bench load``: request-rate sweep through AsyncEngine, prefix reuse on vs off.

Open-loop Poisson arrivals at each ``--rates`` value (requests/s), ``--requests`` per rate.
Multi-tenant chat: ``--tenants`` tenants, each with its own ``--system-len``-token system prompt
(its cache namespace), a fresh ``--turn-len``-token user turn per request, ``--output`` tokens.
Every rate starts on a cold cache (fresh namespaces). Both engines are loaded once and run the
same arrival schedule one after the other at each rate. Measured on the client side:
TTFT = first streamed token - submit, latency = last token - submit; throughput = output
tokens / (last finish - first submit). At low rates prefill is cheap next to the idle time, so
reuse moves latency little; near saturation it decides how many requests the engine can carry.
Times here are wall clock (arrivals are real time); on a shared machine they include other jobs.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.common import RESULTS_DIR, environment, model_dir, percentile, print_table, write_json
from bench.models import QWEN25_05B
from engine.params import SamplingParams
from engine.serving.async_engine import AsyncEngine


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def _args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvgate bench load", description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--rates", type=_floats, default=[0.5, 1.0, 2.0, 4.0])
    p.add_argument("--requests", type=int, default=20, help="requests per rate")
    p.add_argument("--tenants", type=int, default=2)
    p.add_argument("--system-len", type=int, default=256)
    p.add_argument("--turn-len", type=int, default=16)
    p.add_argument("--output", type=int, default=4)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "load.json")
    return p.parse_args(list(argv))


async def _one(
    aeng: AsyncEngine, prompt: list[int], params: SamplingParams, ns: str, delay: float
) -> dict[str, float]:
    await asyncio.sleep(delay)
    t0 = time.monotonic()
    first = None
    tokens = 0
    async for out in aeng.generate(prompt, params, namespace=ns):
        if first is None and out.new_token_ids:
            first = time.monotonic()
        tokens = len(out.token_ids)
    end = time.monotonic()
    assert first is not None
    return {"submit": t0, "ttft": first - t0, "latency": end - t0, "end": end, "tokens": tokens}


async def _rate_run(
    aeng: AsyncEngine, args: argparse.Namespace, rate: float, seed: int, tag: str
) -> dict[str, Any]:
    rng = random.Random(seed)  # same systems, turns and arrivals for both engines
    systems = [[rng.randrange(10, 150_000) for _ in range(args.system_len)]
               for _ in range(args.tenants)]  # fmt: skip
    params = SamplingParams(max_tokens=args.output, temperature=0.0, ignore_eos=True)
    t, jobs = 0.0, []
    for _ in range(args.requests):
        tenant = rng.randrange(args.tenants)
        prompt = systems[tenant] + [rng.randrange(10, 150_000) for _ in range(args.turn_len)]
        jobs.append(_one(aeng, prompt, params, f"{tag}-t{tenant}", t))
        t += rng.expovariate(rate)
    results = await asyncio.gather(*jobs)
    ttft = [r["ttft"] for r in results]
    lat = [r["latency"] for r in results]
    span = max(r["end"] for r in results) - min(r["submit"] for r in results)
    return {
        "ttft_p50": percentile(ttft, 50), "ttft_p90": percentile(ttft, 90),
        "ttft_p99": percentile(ttft, 99),
        "latency_p50": percentile(lat, 50), "latency_p90": percentile(lat, 90),
        "throughput_tok_s": sum(r["tokens"] for r in results) / span,
        "completed_req_s": len(results) / span,
    }  # fmt: skip


async def measure(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    path = model_dir(args.layers, args.model_dir)
    kw: dict[str, Any] = {
        "block_size": args.block_size, "device": "cpu", "dtype": "float32",
        "kv_cache_bytes": 2048 * 2 * args.layers * args.block_size * 128 * 4,
    }  # fmt: skip
    engines = {
        "reuse_on": AsyncEngine.from_pretrained(path, enable_prefix_reuse=True, **kw),
        "reuse_off": AsyncEngine.from_pretrained(path, enable_prefix_reuse=False, **kw),
    }
    raw: dict[str, list[dict[str, Any]]] = {name: [] for name in engines}
    for aeng in engines.values():
        await aeng.start()
    try:
        for name, aeng in engines.items():  # warm-up
            await _rate_run(aeng, args, 100.0, 0, f"warm-{name}")
        for i, rate in enumerate(args.rates):
            for name, aeng in engines.items():
                row = await _rate_run(aeng, args, rate, 100 + i, f"r{i}")
                raw[name].append({"rate": rate, **row})
            print(f"rate {rate} req/s done", flush=True)
    finally:
        for aeng in engines.values():
            await aeng.shutdown()
    return raw


def _plot(args: argparse.Namespace, raw: dict[str, list[dict[str, Any]]]) -> None:
    from bench.plots import lines

    lines(
        args.out.with_suffix(".png"),
        f"load sweep ({args.tenants} tenants, {args.system_len}-token system prompts)",
        args.rates,
        {f"TTFT p50 reuse {m}": [r["ttft_p50"] for r in raw[f"reuse_{m}"]] for m in ("on", "off")}
        | {
            f"TTFT p90 reuse {m}": [r["ttft_p90"] for r in raw[f"reuse_{m}"]] for m in ("on", "off")
        },
        "offered load (requests/s)",
        "TTFT (s)",
        right=(
            "throughput (output tok/s)",
            {
                f"tok/s reuse {m}": [r["throughput_tok_s"] for r in raw[f"reuse_{m}"]]
                for m in ("on", "off")
            },
        ),
    )


def main(argv: Sequence[str]) -> int:
    args = _args(argv)
    torch.set_num_threads(args.threads)
    config = {
        "model": QWEN25_05B.describe(args.layers), "dtype": "float32",
        "block_size": args.block_size, "rates": args.rates, "requests_per_rate": args.requests,
        "tenants": args.tenants, "system_len": args.system_len, "turn_len": args.turn_len,
        "output_tokens": args.output, "arrivals": "Poisson, seeded, same for both engines",
        **environment(args.threads),
    }  # fmt: skip
    print("config:", config, flush=True)
    raw = asyncio.run(measure(args))
    rows = []
    for i, rate in enumerate(args.rates):
        on, off = raw["reuse_on"][i], raw["reuse_off"][i]
        for name, r in (("on", on), ("off", off)):
            keys = ("ttft_p50", "ttft_p90", "latency_p50", "latency_p90")
            rows.append([rate, name, *(r[k] for k in keys), r["throughput_tok_s"],
                         r["completed_req_s"]])  # fmt: skip
    print_table(
        ["rate", "reuse", "TTFT p50", "TTFT p90", "lat p50", "lat p90", "tok/s", "req/s"], rows
    )
    write_json(args.out, {"benchmark": "load", "config": config, "raw": raw})
    _plot(args, raw)
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0
