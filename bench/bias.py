"""``kvgate bench bias``: what one request's ``logit_bias`` adds to every engine step.

The batch: ``--victims`` decoding requests (another tenant's chats), plus one chat request with
``n = --n`` choices (``n`` engine requests with one SamplingParams, as the gateway sends them).
Three configurations of that group, measured side by side in one engine, interleaved over
``--repeats``: no bias; ``--entries`` bias entries per choice (the gateway's cap is 300); and
``--large-entries`` (what the engine does with a request past that cap, e.g. sent to a worker
directly). Reported: the step time in steady decode (CPU seconds of this process, one torch
thread by default; wall seconds in the JSON) and its ratio to the unbiased group, i.e. how much the
bias slows every concurrent request; and the sampler alone on the same batch's logits.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.common import RESULTS_DIR, environment, model_dir, print_table, summarize, write_json
from bench.models import QWEN25_05B
from engine.params import SamplingParams
from engine.runtime.sampling import Sampler
from engine.serving.engine import Engine

VOCAB_LO, VOCAB_HI = 10, 150_000


def _args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvgate bench bias", description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--victims", type=int, default=4, help="concurrent plain requests")
    p.add_argument("--n", type=int, default=128, help="choices of the biased request")
    p.add_argument("--entries", type=int, default=300, help="bias entries per choice")
    p.add_argument("--large-entries", type=int, default=49_152, help="0: skip that case")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--steps", type=int, default=6, help="timed decode steps per repeat")
    p.add_argument("--large-steps", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sampler-calls", type=int, default=15)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--label", default=None, help="stored in the JSON (default: git commit)")
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "bias.json")
    return p.parse_args(list(argv))


def _bias(rng: random.Random, entries: int) -> tuple[tuple[int, float], ...]:
    tokens = rng.sample(range(VOCAB_LO, VOCAB_HI), entries)
    return tuple((t, round(rng.uniform(-5.0, 5.0), 3)) for t in tokens)


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(n)]


def _step_times(
    eng: Engine, args: argparse.Namespace, group: SamplingParams, steps: int, rng: random.Random
) -> list[tuple[float, float]]:
    """(CPU, wall) seconds of each of ``steps`` decode steps of victims + the n-choice group."""
    budget = 3 + steps  # prefill step, one warm decode step, the timed ones
    victim = SamplingParams(max_tokens=budget, temperature=0.7, seed=1, ignore_eos=True)
    group = dataclasses.replace(group, max_tokens=budget)  # the n choices share it
    ids = [eng.add_request(_tokens(rng, args.prompt_len), victim) for _ in range(args.victims)]
    prompt = _tokens(rng, args.prompt_len)
    ids += [eng.add_request(prompt, group, namespace="group") for _ in range(args.n)]
    for _ in range(2):
        eng.step()
    times = []
    for _ in range(steps):
        cpu, wall = time.process_time(), time.perf_counter()
        eng.step()
        times.append((time.process_time() - cpu, time.perf_counter() - wall))
    for rid in ids:
        eng.abort(rid)
    while eng.has_unfinished():
        eng.step()
    return times


def _sampler_time(batch: int, params: list[SamplingParams], calls: int) -> dict[str, float]:
    """CPU seconds of one sampler call (min and median over ``calls`` steps of the same
    requests; the min is the least disturbed by other jobs on a shared machine)."""
    logits = torch.randn(batch, QWEN25_05B.vocab, generator=torch.Generator().manual_seed(0))
    sampler, ids = Sampler(), [f"r{i}" for i in range(batch)]
    times = []
    for step in range(calls + 1):
        t = time.process_time()
        sampler(logits, params, [step] * batch, [[1, 2, 3]] * batch, ids)
        times.append(time.process_time() - t)
    return {"min": min(times[1:]), "median": statistics.median(times[1:])}  # first: builds


def _cases(args: argparse.Namespace, rng: random.Random) -> dict[str, SamplingParams]:
    base = SamplingParams(temperature=1.0)
    cases = {"no bias": base}
    for entries in (args.entries, args.large_entries):
        if entries:
            cases[f"{entries} entries"] = dataclasses.replace(base, logit_bias=_bias(rng, entries))
    return cases


def run(args: argparse.Namespace, path: Path) -> dict[str, Any]:
    rng = random.Random(args.seed)
    eng = Engine.from_pretrained(path, block_size=16, device="cpu", kv_cache_bytes=128 << 20)
    cases = _cases(args, rng)
    steps: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    for _ in range(args.repeats):  # interleaved: each repeat measures every case once
        for name, params in cases.items():
            n = args.large_steps if name == f"{args.large_entries} entries" else args.steps
            steps[name] += _step_times(eng, args, params, n, rng)
    batch = args.victims + args.n
    victims = [SamplingParams(temperature=0.7, seed=1)] * args.victims
    sampler = {
        name: _sampler_time(batch, victims + [p] * args.n, args.sampler_calls)
        for name, p in cases.items()
    }
    base = statistics.median(c for c, _ in steps["no bias"])
    rows = {}
    for name, times in steps.items():
        cpu = [c for c, _ in times]
        rows[name] = {
            "step_cpu_s": summarize(cpu),
            "step_wall_s": summarize([w for _, w in times]),
            "ratio_to_no_bias": statistics.median(cpu) / base,
            "sampler_cpu_s": sampler[name],
            "sampler_added_s": sampler[name]["min"] - sampler["no bias"]["min"],
        }
    return {"cases": rows}


def _label() -> str:
    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=10
        )
        return done.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def _config(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "benchmark": "bias",
        "label": args.label or _label(),
        "model": QWEN25_05B.describe(args.layers),
        "dtype": "float32",
        "block_size": 16,
        "victims": args.victims,
        "n": args.n,
        "entries": args.entries,
        "large_entries": args.large_entries,
        "prompt_len": args.prompt_len,
        "steps": args.steps,
        "large_steps": args.large_steps,
        "repeats": args.repeats,
        "sampler_calls": args.sampler_calls,
        "torch": torch.__version__,
        **environment(args.threads),
    }


def _print(result: dict[str, Any]) -> None:
    headers = ["group of choices", "step CPU s (median)", "min", "max", "x no bias",
               "sampler s (min)", "added by bias"]  # fmt: skip
    rows = [
        [name, r["step_cpu_s"]["median"], r["step_cpu_s"]["min"], r["step_cpu_s"]["max"],
         r["ratio_to_no_bias"], r["sampler_cpu_s"]["min"], r["sampler_added_s"]]
        for name, r in result["cases"].items()
    ]  # fmt: skip
    print_table(headers, rows)


def main(argv: Sequence[str]) -> int:
    args = _args(argv)
    torch.set_num_threads(args.threads)
    config = _config(args)
    print(config)
    result = {"config": config, **run(args, model_dir(args.layers, args.model_dir))}
    _print(result)
    write_json(args.out, result)
    print(f"results written to {args.out}")
    return 0
