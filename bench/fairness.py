"""``kvgate bench fairness``: one tenant's flood vs another tenant's TTFT, FCFS vs fair.

Tenant A runs closed loop with ``--a-concurrency`` requests in flight (each a fresh
``--a-prompt``-token prompt, ``--a-output`` tokens), far beyond its fair share; tenant B sends
open-loop requests at a steady ``--b-rate`` (``--b-prompt`` tokens, ``--b-output`` tokens).
Three runs on the same engine geometry, one after the other in this invocation: B alone (the
baseline), B under A's flood with ``scheduling="fcfs"``, and with ``scheduling="fair"``. Then
three closed-loop tenants at weights 1:2:4 on a fair engine with ``--weights-seqs`` running
slots (so that all three stay backlogged): the tokens the engine computed for each over its
first ``--weights-steps`` steps once all three have arrived (counted in steps, not seconds: a
request holds its slot for a prefill and ``--a-output`` decode steps, and a window of one such
lifetime measures how the first slots fell, not the weights; the VTC bound is about one
request's tokens, so the ratio settles once a tenant has been served many requests).
Then a victim's decode rate beside a tenant decoding over a long cached context vs a short one
(bench/fairness_decode.py). ``--only weights`` / ``--only decode`` runs that part alone and
updates its entries in an existing ``--out`` file, keeping the other results.
Reported: B's TTFT p50/p99 and end-to-end latency, tokens/s per tenant (prompt + output tokens
computed for it, client side), total, and the engine's step time. Times are wall clock on a
shared machine; the ratios side by side are what to read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

from bench import fairness_decode
from bench.common import RESULTS_DIR, environment, model_dir, percentile, print_table, write_json
from bench.models import QWEN25_05B
from engine.params import SamplingParams
from engine.serving.async_engine import AsyncEngine


def _args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvgate bench fairness", description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--duration", type=float, default=25.0, help="seconds of B traffic per run")
    p.add_argument("--a-concurrency", type=int, default=64)
    p.add_argument("--a-prompt", type=int, default=256)
    p.add_argument("--a-output", type=int, default=16)
    p.add_argument("--b-rate", type=float, default=0.5, help="B requests/s")
    p.add_argument("--b-prompt", type=int, default=64)
    p.add_argument("--b-output", type=int, default=8)
    p.add_argument("--budget", type=int, default=1024, help="max_num_batched_tokens")
    p.add_argument("--fair-prefill", type=int, default=128, help="fair_prefill_tokens")
    p.add_argument("--fair-decode-rows", type=int, default=None, help="fair_decode_rows")
    p.add_argument("--weights-steps", type=int, default=200, help="engine steps measured")
    p.add_argument("--weights-long-steps", type=int, default=600, help="the same, long outputs")
    p.add_argument("--weights-repeats", type=int, default=3)
    p.add_argument("--weights-timeout", type=float, default=900.0, help="seconds at most")
    p.add_argument("--only", choices=["all", "weights", "decode"], default="all")
    p.add_argument("--weights-seqs", type=int, default=12, help="max_num_seqs of that run")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "fairness.json")
    fairness_decode.add_args(p)
    return p.parse_args(list(argv))


def _engine(args: argparse.Namespace, scheduling: str, **extra: Any) -> AsyncEngine:
    aeng = AsyncEngine.from_pretrained(
        model_dir(args.layers, args.model_dir),
        **fairness_decode.engine_options(args),
        fair_prefill_tokens=args.fair_prefill,
        fair_decode_rows=args.fair_decode_rows,
        scheduling=scheduling,
        **extra,
    )
    steps: list[tuple[float, float]] = []
    served: list[dict[str, int]] = []  # after each step: tokens computed per tenant so far
    core = aeng._core  # the step time is the engine's own; measured around its step()
    step = core.step
    fair = core.scheduler.fair

    def timed() -> Any:
        t0 = time.monotonic()
        out = step()
        steps.append((t0, time.monotonic() - t0))
        served.append({t: s.served_tokens for t, s in fair.tenants.items()})
        return out

    core.step = timed  # type: ignore[method-assign]
    aeng.bench_steps = steps  # type: ignore[attr-defined]
    aeng.bench_served = served  # type: ignore[attr-defined]
    return aeng


async def _request(
    aeng: AsyncEngine, rng: random.Random, n_prompt: int, n_out: int, tenant: str, weight: float
) -> dict[str, float]:
    prompt = [rng.randrange(10, 150_000) for _ in range(n_prompt)]
    params = SamplingParams(max_tokens=n_out, temperature=0.0, ignore_eos=True)
    t0 = time.monotonic()
    first = None
    async for out in aeng.generate(prompt, params, namespace=tenant, tenant=tenant, weight=weight):
        if first is None and out.new_token_ids:
            first = time.monotonic()
    end = time.monotonic()
    assert first is not None
    return {"submit": t0, "ttft": first - t0, "latency": end - t0, "end": end}


async def _closed_loop(
    aeng: AsyncEngine, args: argparse.Namespace, tenant: str, weight: float, width: int,
    stop: asyncio.Event, served: dict[str, int], seed: int, shape: tuple[int, int] | None = None,
) -> None:  # fmt: skip
    rng = random.Random(seed)
    n_prompt, n_out = shape or (args.a_prompt, args.a_output)

    async def worker() -> None:
        while not stop.is_set():
            await _request(aeng, rng, n_prompt, n_out, tenant, weight)
            if not stop.is_set():
                served[tenant] += n_prompt + n_out

    await asyncio.gather(*(worker() for _ in range(width)))


async def _run(aeng: AsyncEngine, args: argparse.Namespace, flood: bool) -> dict[str, Any]:
    rng = random.Random(7)  # the same B arrivals in every run
    stop = asyncio.Event()
    served = {"A": 0, "B": 0}
    a_task = None
    if flood:
        a_task = asyncio.create_task(
            _closed_loop(aeng, args, "A", 1.0, args.a_concurrency, stop, served, 1)
        )
        await asyncio.sleep(3.0)  # A's queue builds up first
    aeng.bench_steps.clear()  # type: ignore[attr-defined]
    a0 = _engine_served(aeng, "A")
    start = time.monotonic()
    b_jobs = []
    t = 0.0
    while t < args.duration:
        b_jobs.append(asyncio.create_task(_b_one(aeng, args, rng, t, served)))
        t += 1.0 / args.b_rate
    b = await asyncio.gather(*b_jobs)
    span = time.monotonic() - start
    a_served = _engine_served(aeng, "A") - a0  # A is backlogged throughout: counted in the engine
    stop.set()
    if a_task is not None:
        a_task.cancel()  # leaving the streams aborts A's requests
        await asyncio.gather(a_task, return_exceptions=True)
    steps = [s for _, s in aeng.bench_steps]  # type: ignore[attr-defined]
    ttft = [r["ttft"] for r in b]
    lat = [r["latency"] for r in b]
    return {
        "b_ttft_p50": percentile(ttft, 50), "b_ttft_p99": percentile(ttft, 99),
        "b_latency_p50": percentile(lat, 50), "b_latency_p99": percentile(lat, 99),
        "a_tok_s": a_served / span, "b_tok_s": served["B"] / span,
        "total_tok_s": (a_served + served["B"]) / span,
        "step_p50_s": percentile(steps, 50), "step_p99_s": percentile(steps, 99),
        "b_requests": len(b),
        "b_ttft_series": [(round(r["submit"] - start, 3), round(r["ttft"], 4)) for r in b],
    }  # fmt: skip


def _engine_served(aeng: AsyncEngine, tenant: str) -> int:
    """Tokens the engine computed for ``tenant`` (prompt + output, cached prefix excluded),
    read from its fair-share state (kept while the tenant has requests)."""
    state = aeng._core.scheduler.fair.tenants.get(tenant)
    return 0 if state is None else state.served_tokens


async def _b_one(
    aeng: AsyncEngine, args: argparse.Namespace, rng: random.Random, delay: float,
    served: dict[str, int],
) -> dict[str, float]:  # fmt: skip
    n_prompt = args.b_prompt
    sub = random.Random(rng.random())
    await asyncio.sleep(delay)
    r = await _request(aeng, sub, n_prompt, args.b_output, "B", 1.0)
    served["B"] += n_prompt + args.b_output
    return r


WEIGHTS = (("w1", 1.0), ("w2", 2.0), ("w4", 4.0))


class WeightsCase(NamedTuple):
    """A weights scenario: prompt and output tokens of every request, engine steps w1 runs
    alone first (0: all start together), engine steps measured after that."""

    prompt: int
    output: int
    head_start: int
    steps: int


def _cases(args: argparse.Namespace) -> dict[str, WeightsCase]:
    return {
        "weights_1_2_4": WeightsCase(args.a_prompt, args.a_output, 0, args.weights_steps),
        # w1 takes every slot first with long outputs: left to finishing requests, slots
        # would change hands only every ``output`` steps.
        "weights_1_2_4_long_outputs": WeightsCase(32, 128, 8, args.weights_long_steps),
    }


async def _weights(
    aeng: AsyncEngine, args: argparse.Namespace, case: WeightsCase
) -> dict[str, Any]:
    """Three backlogged closed-loop tenants at weights 1:2:4 on the fair engine; the engine's
    own count of computed tokens per tenant over ``case.steps`` steps."""
    stop = asyncio.Event()
    served = {t: 0 for t, _ in WEIGHTS}
    log: list[dict[str, int]] = aeng.bench_served  # type: ignore[attr-defined]
    shape = (case.prompt, case.output)
    tasks = []
    for i, (t, w) in enumerate(WEIGHTS):
        if i == 1 and case.head_start:
            while len(log) < case.head_start:
                await asyncio.sleep(0.01)
        loop = _closed_loop(aeng, args, t, w, 16, stop, served, i, shape)
        tasks.append(asyncio.create_task(loop))
    created = len(log)
    start = time.monotonic()
    # The window opens at the first step in which every tenant has arrived (all backlogged,
    # which is what VTC's bound is about): until then the first tenant runs alone on idle
    # capacity, which the lift rightly does not let the latecomers reclaim.
    while not (log and len(log[-1]) == len(WEIGHTS)) and time.monotonic() - start < 60:
        await asyncio.sleep(0.005)
    first = len(log)
    while len(log) < first + case.steps and time.monotonic() - start < args.weights_timeout:
        await asyncio.sleep(0.05)
    span = time.monotonic() - start
    n = min(len(log) - first, case.steps)
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    base = log[first - 1] if first else {}

    def window(m: int) -> dict[str, int]:
        return {t: log[first + m - 1].get(t, 0) - base.get(t, 0) for t, _ in WEIGHTS}

    marks = sorted({m for m in (17, 50, 100, 200, 400, n) if 0 < m <= n})
    return {
        "steps": n,
        "steps_before_all_arrived": first - created,
        "seconds": round(span, 1),
        "engine_served_tokens": window(n) if n else {},
        "ratio_to_w1": _ratios(window(n)) if n else {},
        "ratio_to_w1_after_steps": {str(m): _ratios(window(m)) for m in marks},
        "preemptions": aeng._core.scheduler.num_preemptions,
    }


def _ratios(served: dict[str, int]) -> dict[str, float]:
    base = served.get("w1", 0) or 1
    return {t: round(served.get(t, 0) / base, 3) for t, _ in WEIGHTS}


async def _weights_run(args: argparse.Namespace) -> dict[str, Any]:
    # Weights need backlogged tenants: few running slots, so every tenant always has requests
    # waiting (with all requests running at once each tenant is limited by its own loop).
    out = {}
    for name, case in _cases(args).items():
        runs = []
        for _ in range(args.weights_repeats):
            aeng = _engine(args, "fair", max_num_seqs=args.weights_seqs)
            await aeng.start()
            try:
                runs.append(await _weights(aeng, args, case))
            finally:
                await aeng.shutdown()
            print(name, runs[-1], flush=True)
        out[name] = _summary(runs)
    return out


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median ratio per tenant over the repeats (each a fresh engine), with the min-max."""
    ratios = {t: sorted(r["ratio_to_w1"][t] for r in runs) for t, _ in WEIGHTS}
    return {
        "ratio_to_w1": {t: statistics.median(v) for t, v in ratios.items()},
        "ratio_min_max": {t: [v[0], v[-1]] for t, v in ratios.items()},
        "runs": runs,
    }


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, policy, flood in (("b_alone", "fair", False), ("fcfs", "fcfs", True),
                                ("fair", "fair", True)):  # fmt: skip
        aeng = _engine(args, policy)
        await aeng.start()
        try:
            await _request(aeng, random.Random(0), 32, 2, "warm", 1.0)
            out[name] = await _run(aeng, args, flood)
        finally:
            await aeng.shutdown()
        print(f"{name} done", flush=True)
    out.update(await _weights_run(args))
    return out


def main(argv: Sequence[str]) -> int:
    args = _args(argv)
    torch.set_num_threads(args.threads)
    config = {
        "geometry": QWEN25_05B.describe(args.layers), "block_size": args.block_size,
        "max_num_batched_tokens": args.budget, "fair_prefill_tokens": args.fair_prefill,
        "fair_decode_rows": args.fair_decode_rows,
        "a": {"concurrency": args.a_concurrency, "prompt": args.a_prompt,
              "output": args.a_output},
        "b": {"rate": args.b_rate, "prompt": args.b_prompt, "output": args.b_output},
        "duration_s": args.duration,
    }  # fmt: skip
    weights_config = {
        "weights": dict(WEIGHTS), "concurrency_per_tenant": 16, "max_num_seqs": args.weights_seqs,
        **{name: case._asdict() for name, case in _cases(args).items()},
    }  # fmt: skip
    decode_config = fairness_decode.config(args)
    parts = {"all": config, "weights": weights_config, "decode": decode_config}
    print(parts[args.only], flush=True)
    if args.only == "weights":
        return _only(args, "weights", weights_config, asyncio.run(_weights_run(args)))
    if args.only == "decode":
        return _only(args, "decode", decode_config, {"decode": fairness_decode.measure(args)})
    res = asyncio.run(measure(args))
    res["decode"] = fairness_decode.measure(args)
    rows = []
    for name in ("b_alone", "fcfs", "fair"):
        r = res[name]
        rows.append([name, r["b_ttft_p50"], r["b_ttft_p99"], r["b_latency_p50"],
                     r["b_latency_p99"], r["a_tok_s"], r["b_tok_s"], r["total_tok_s"],
                     r["step_p50_s"], r["step_p99_s"]])  # fmt: skip
    print_table(["run", "B ttft p50", "B ttft p99", "B e2e p50", "B e2e p99", "A tok/s",
                 "B tok/s", "total tok/s", "step p50", "step p99"], rows)  # fmt: skip
    fair, fcfs, alone = res["fair"], res["fcfs"], res["b_alone"]
    goals = {
        "b_p99_vs_alone_plus_step": fair["b_ttft_p99"] <= alone["b_ttft_p99"] + fair["step_p99_s"],
        "b_p99_fair_over_fcfs": fair["b_ttft_p99"] / fcfs["b_ttft_p99"],
        "total_fair_over_fcfs": fair["total_tok_s"] / fcfs["total_tok_s"],
        **_weights_goals(res),
        **fairness_decode.goals(res),
    }
    print(goals, flush=True)
    write_json(
        args.out,
        {"benchmark": "fairness",
         "config": {**config, "weights": weights_config, "decode": decode_config},
         "environment": environment(args.threads), "results": res, "goals": goals},
    )  # fmt: skip
    try:
        _plot(args, res)
    except ImportError:
        print("matplotlib is not installed: no PNG", flush=True)
    return 0


def _weights_goals(res: dict[str, Any]) -> dict[str, Any]:
    goals: dict[str, Any] = {}
    for name in [k for k in res if k.startswith("weights_")]:
        ratio = res[name]["ratio_to_w1"]
        within = bool(ratio) and all(abs(ratio[t] / w - 1.0) <= 0.1 for t, w in WEIGHTS)
        goals[f"{name}_ratio"] = ratio
        goals[f"{name}_within_10_percent"] = within
    return goals


def _only(
    args: argparse.Namespace, part: str, part_config: dict[str, Any], results: dict[str, Any]
) -> int:
    """One part run alone (``--only``): its entries in ``--out`` are replaced, the rest kept
    (``<part>_environment`` says where this run was made)."""
    doc = json.loads(args.out.read_text(encoding="utf-8")) if args.out.exists() else {}
    doc.setdefault("benchmark", "fairness")
    doc.setdefault("config", {})[part] = part_config
    doc.setdefault("results", {}).update(results)
    doc[f"{part}_environment"] = environment(args.threads)
    goals = doc.setdefault("goals", {})
    goals.pop("weights_ratio", None)  # the earlier name of weights_1_2_4_ratio
    goals.update({**_weights_goals(doc["results"]), **fairness_decode.goals(doc["results"])})
    write_json(args.out, doc)
    return 0


def _plot(args: argparse.Namespace, res: dict[str, Any]) -> None:
    from bench.plots import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name in ("b_alone", "fcfs", "fair"):
        pts = res[name]["b_ttft_series"]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax.set_yscale("log")
    ax.set_xlabel("B request submitted at (s into the run)")
    ax.set_ylabel("B TTFT (s)")
    ax.set_title(f"B's TTFT under A's flood ({args.a_concurrency} concurrent)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out.with_suffix(".png"), dpi=110)
    plt.close(fig)
