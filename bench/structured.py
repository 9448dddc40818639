"""``kvgate bench structured``: decode speed under a strict JSON schema vs unconstrained.

For each batch size (``--batches``, default 1, 16, 64): that many requests decode side by side,
all constrained by one strict schema (nested objects, arrays, enums, patterns, required fields,
``additionalProperties: false``) or all unconstrained, interleaved over ``--repeats`` in one
engine. Reported: decode tokens/s (batch / median step wall time of the steps where every request
is still decoding) and the overhead, the mask fill time per step (p50 / p99; it runs on a worker
thread during the forward), how many steps waited for their masks at the sampler, and the grammar
compile time cold and cached. The model is random weights of the reference geometry
(Qwen2.5-0.5B, ``--layers``); the tokenizer is the default model's (SmolLM2, 49k tokens) when it
is cached here, else the demo tokenizer (2k): mask cost follows the tokenizer's vocabulary.
Beside the ratio of step medians, the JSON gives the constrained step's critical-path cost
measured piece by piece (matcher sync and advance on the engine thread, the mask's application
in the sampler, waits), which a busy machine disturbs far less.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.common import RESULTS_DIR, environment, model_dir, percentile, print_table, write_json
from bench.models import QWEN25_05B
from engine.constraints import Grammar
from engine.constraints.compiler import check_grammar, compiler_for
from engine.params import SamplingParams
from engine.runtime import cpu_isa
from engine.runtime.sampling import Sampler
from engine.serving.engine import Engine
from engine.text.tokenizer import Tokenizer

SMOLLM2 = Path.home() / ".cache" / "kvgate" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
# Strict and bounded; the summary's minimum length keeps every document longer than the timed
# steps, so the batch stays whole while it is measured.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "pattern": "^[a-f0-9]{8}$"},
        "summary": {"type": "string", "minLength": 48, "maxLength": 64},
        "status": {"enum": ["open", "closed", "pending"]},
        "owner": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,10}$"},
                "age": {"type": "integer", "minimum": 18, "maximum": 99},
            },
            "required": ["name", "age"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 4},
    },
    "required": ["id", "summary", "status", "owner", "tags"],
    "additionalProperties": False,
}


def _args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvgate bench structured", description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--steps", type=int, default=12, help="timed decode steps per repeat")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tokenizer", choices=("auto", "smollm2", "demo"), default="auto")
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "structured.json")
    return p.parse_args(list(argv))


def _with_tokenizer(base: Path, which: str) -> tuple[Path, str]:
    """The random model, with the SmolLM2 tokenizer swapped in when asked (and cached)."""
    if which == "demo" or (which == "auto" and not SMOLLM2.is_file()):
        return base, "demo (2,000 tokens)"
    from engine.runtime.model.gguf import GGUFFile
    from engine.text.gguf_tokenizer import gguf_tokenizer

    tok = gguf_tokenizer(GGUFFile.open(SMOLLM2).metadata, str(SMOLLM2))
    path = base.with_name(base.name + "-smollm2-tokenizer")
    path.mkdir(exist_ok=True)
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        if not (path / name).exists():
            (path / name).symlink_to(base / name)
    (path / "tokenizer.json").write_text(tok.backend.to_str(), encoding="utf-8")
    eos = tok.backend.id_to_token(tok.eos_token_ids[0])
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": eos}), encoding="utf-8")
    return path, f"SmolLM2-135M ({tok.vocab_size:,} tokens)"


def _step_times(
    eng: Engine, batch: int, params: SamplingParams, args: argparse.Namespace, rng: random.Random
) -> list[float]:
    """Wall seconds of the decode steps in which all ``batch`` requests decode."""
    ids = [
        eng.add_request([rng.randrange(10, 1900) for _ in range(args.prompt_len)], params)
        for _ in range(batch)
    ]
    eng.step()  # the prefill of every prompt, and the first tokens
    eng.step()  # one decode step untimed
    times = []
    for _ in range(args.steps):
        if eng.scheduler.num_running < batch:
            break
        start = time.perf_counter()
        eng.step()
        times.append(time.perf_counter() - start)
    for rid in ids:
        eng.abort(rid)
    while eng.has_unfinished():
        eng.step()
    return times


def _sampler_cost(
    eng: Engine, batch: int, params: SamplingParams, calls: int = 15
) -> dict[str, float]:
    """Min seconds of one sampler call on [batch, V] logits with the batch's masks (already
    filled: only their application) and without: the mask's share of the critical path."""
    runtime = eng.core.runner.grammar
    ids = [f"sampler-{i}" for i in range(batch)]
    rows = [params] * batch
    histories: list[list[int]] = [[1, 2, 3] for _ in range(batch)]
    step = runtime.begin(ids, rows, histories, [0] * batch)
    assert step is not None
    step.mask.wait()
    logits = torch.randn(batch, QWEN25_05B.vocab, generator=torch.Generator().manual_seed(0))
    free = [dataclasses.replace(params, grammar=None)] * batch
    sampler = Sampler()
    times: dict[str, list[float]] = {"with_mask": [], "without": []}
    for _ in range(calls):  # interleaved
        for name, ps, mask in (("with_mask", rows, step.mask), ("without", free, None)):
            start = time.perf_counter()
            sampler(logits, ps, [0] * batch, histories, ids, mask)
            times[name].append(time.perf_counter() - start)
    return {name: min(t) for name, t in times.items()}


def _compile_times(tokenizer: Tokenizer) -> dict[str, float]:
    compiler = compiler_for(tokenizer)
    start = time.perf_counter()
    _ = compiler.ll_tokenizer
    build = time.perf_counter() - start
    cold, cached = [], []
    for i in range(5):
        g = Grammar("json_schema", json.dumps({**SCHEMA, "title": f"cold-{i}"}))
        start = time.perf_counter()
        check_grammar(g, tokenizer)
        cold.append(time.perf_counter() - start)
        for _ in range(20):
            start = time.perf_counter()
            check_grammar(g, tokenizer)
            cached.append(time.perf_counter() - start)
    return {
        "tokenizer_build_s": build,
        "cold_median_s": statistics.median(cold),
        "cached_median_s": statistics.median(cached),
    }


def run(args: argparse.Namespace, path: Path) -> dict[str, Any]:
    rng = random.Random(0)
    eng = Engine.from_pretrained(path, block_size=16, device="cpu", kv_cache_bytes=512 << 20)
    grammar = Grammar("json_schema", json.dumps(SCHEMA))
    compile_s = _compile_times(Tokenizer.from_pretrained(path))
    cases = {
        "unconstrained": SamplingParams(max_tokens=512, temperature=1.0, ignore_eos=True),
        "json schema": SamplingParams(max_tokens=512, temperature=1.0, grammar=grammar),
    }
    stats = eng.core.runner.grammar.stats
    rows: dict[str, Any] = {}
    for batch in [int(b) for b in args.batches.split(",")]:
        times: dict[str, list[float]] = {name: [] for name in cases}
        fills: list[float] = []
        host: list[float] = []
        before = stats().masks
        waits0, steps0, wait_s0 = before.waits, before.steps, before.wait_seconds
        for _ in range(args.repeats):  # interleaved
            for name, params in cases.items():
                n_fill, n_host = len(stats().masks.fill_seconds), len(stats().masks.host_seconds)
                times[name] += _step_times(eng, batch, params, args, rng)
                if name == "json schema":
                    fills += list(stats().masks.fill_seconds)[n_fill:]
                    host += list(stats().masks.host_seconds)[n_host:]
        after = stats().masks
        free, bound = (statistics.median(times[n]) for n in cases)
        sampler = _sampler_cost(eng, batch, cases["json schema"])
        applied = sampler["with_mask"] - sampler["without"]
        waited = (after.wait_seconds - wait_s0) / max(1, after.steps - steps0)
        rows[str(batch)] = {
            "unconstrained_tok_s": batch / free,
            "constrained_tok_s": batch / bound,
            "overhead": bound / free - 1.0,
            "step_s": {
                n: {"median": statistics.median(t), "min": min(t), "max": max(t), "count": len(t)}
                for n, t in times.items()
            },
            "mask_fill_s": {"p50": percentile(fills, 50), "p99": percentile(fills, 99)},
            "host_s_p50": percentile(host, 50),
            "sampler_s_min": sampler,
            # On the step's critical path: matcher sync + hand-off + advance, the mask's
            # application in the sampler, and any wait; over the unconstrained step (medians
            # and minimums: robust to a busy machine, unlike the ratio of step medians above).
            "critical_path_overhead": (percentile(host, 50) + applied + waited) / free,
            "mask_steps": after.steps - steps0,
            "steps_waited": after.waits - waits0,
            "wait_s_total": after.wait_seconds - wait_s0,
        }
    return {"batches": rows, "compile": compile_s}


def _config(args: argparse.Namespace, tokenizer: str) -> dict[str, Any]:
    return {
        "benchmark": "structured",
        "model": QWEN25_05B.describe(args.layers) + " (random weights)",
        "tokenizer": tokenizer,
        "dtype": "float32",
        "block_size": 16,
        "prompt_len": args.prompt_len,
        "steps": args.steps,
        "repeats": args.repeats,
        "isa": {
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "KVGATE_CPU_ISA": cpu_isa.requested(),
        },
        "load_average_at_start": os.getloadavg(),
        "torch": torch.__version__,
        **environment(args.threads),
    }


def _print(result: dict[str, Any]) -> None:
    headers = ["batch", "free tok/s", "schema tok/s", "overhead", "critical path", "mask p50 ms",
               "mask p99 ms", "steps waited"]  # fmt: skip
    rows = [
        [b, r["unconstrained_tok_s"], r["constrained_tok_s"], f"{100 * r['overhead']:+.1f}%",
         f"{100 * r['critical_path_overhead']:+.1f}%", 1e3 * r["mask_fill_s"]["p50"],
         1e3 * r["mask_fill_s"]["p99"], f"{r['steps_waited']}/{r['mask_steps']}"]
        for b, r in result["batches"].items()
    ]  # fmt: skip
    print_table(headers, rows)
    c = result["compile"]
    cold, cached = 1e3 * c["cold_median_s"], 1e6 * c["cached_median_s"]
    build = c["tokenizer_build_s"]
    print(
        f"compile: tokenizer {build:.3f} s once; schema cold {cold:.2f} ms, cached {cached:.1f} us"
    )


def _note(start: Sequence[float], end: Sequence[float]) -> str:
    cpus = os.cpu_count() or 1
    busiest = max(start[0], end[0])
    if busiest <= 0.75 * cpus:
        return "quiet machine"
    return (
        f"busy machine (1-minute load up to {busiest:.1f} on {cpus} cores): step medians are "
        "noisy, compare the critical-path overhead, which is measured piece by piece"
    )


def main(argv: Sequence[str]) -> int:
    args = _args(argv)
    torch.set_num_threads(args.threads)
    path, tokenizer = _with_tokenizer(model_dir(args.layers, args.model_dir), args.tokenizer)
    config = _config(args, tokenizer)
    print(config)
    result = {"config": config, **run(args, path)}
    result["load_average_at_end"] = os.getloadavg()
    result["note"] = _note(config["load_average_at_start"], result["load_average_at_end"])
    _print(result)
    write_json(args.out, result)
    print(f"results written to {args.out}")
    return 0
