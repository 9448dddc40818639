"""``python -m bench.gpu_engine``: the engine end to end on a GPU (run by bench/gpu_check.sh).

Sections of the JSON result, all on one random-weight model (Qwen2.5-0.5B geometry):

  parity    kvgate bf16 logits vs HF transformers bf16 (SDPA) on the same weights: max abs diff
            and top-1 agreement of the last-token logits of ragged prompts
  startup   load, warm-up and CUDA-graph capture seconds, KV blocks sized by profiling, Triton
            compilations during a mixed workload after start-up (compile hook; 0 expected)
  decode    tokens/s at batch 1, 8 and 64 (whole steps: forward + sampling), CUDA graphs on/off
  prefill   tokens/s of kvgate vs the HF SDPA forward on the same prompts
  burst     the cold-cache burst (16 x (1024 + 32) tokens, 8 out): TTFT, early reuse vs off

``--dry-run``: CPU, a tiny geometry, float32, one repeat: runs the program end to end (the
numbers mean nothing; graphs and compilation counts are absent on the CPU).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.burst import _burst
from bench.common import RESULTS_DIR
from bench.models import QWEN25_05B, Geometry, make_random_model
from engine.config import EngineConfig
from engine.core.batch import ScheduledBatch, ScheduledSeq
from engine.params import SamplingParams
from engine.runtime.runner import ModelRunner
from engine.serving.engine import Engine, EngineCore

TINY = Geometry(
    hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=1000, max_pos=2048,
    rope_theta=10000.0, tied=True,
)  # fmt: skip
GREEDY = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)


@dataclass(frozen=True)
class Plan:
    device: str
    dtype: str  # engine dtype name ("bfloat16" on the GPU)
    geometry: Geometry
    layers: int
    prompt_lens: tuple[int, ...]  # parity prompts
    prefill: tuple[int, int]  # (prompts, tokens each)
    decode_batches: tuple[int, ...]
    decode_context: int
    decode_steps: int
    burst: tuple[int, int, int, int]  # requests, system, turn, output
    repeats: int
    kv_bytes: int  # explicit KV budget of the burst engines


GPU_PLAN = Plan("cuda", "bfloat16", QWEN25_05B, 24, (7, 100, 333, 1000, 17, 1), (8, 1024),
                (1, 8, 64), 512, 64, (16, 1024, 32, 8), 3, 4 << 30)  # fmt: skip
DRY_PLAN = Plan("cpu", "float32", TINY, 1, (7, 30, 1), (2, 32), (1, 2), 16, 2,
                (3, 32, 4, 2), 1, 16 << 20)  # fmt: skip


def _args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.gpu_engine", description=__doc__.split("\n")[0]
    )
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny geometry, one repeat")
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args(list(argv))


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _median_time(fn: Callable[[], object], device: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _prompts(lens: Sequence[int], vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab - 1) for _ in range(n)] for n in lens]


def _seqs(prompts: Sequence[Sequence[int]], block_size: int, first_block: int = 0) -> list:
    seqs, block = [], first_block
    for i, tokens in enumerate(prompts):
        n = -(-(len(tokens) + 1) // block_size)
        table = list(range(block, block + n))
        block += n
        seqs.append(ScheduledSeq(f"r{i}", list(tokens), 0, table, True, GREEDY))
    return seqs


# ---------------------------------------------------------------- HF transformers (the peer)


def _hf_measure(model: Any, plan: Plan) -> tuple[torch.Tensor, float]:
    prompts = _prompts(plan.prompt_lens, plan.geometry.vocab, 1)
    with torch.inference_mode():
        rows = [model(torch.tensor([p], device=plan.device)).logits[0, -1].float() for p in prompts]
        n, length = plan.prefill
        ids = torch.tensor(_prompts([length] * n, plan.geometry.vocab, 2), device=plan.device)
        seconds = _median_time(lambda: model(ids, logits_to_keep=1), plan.device, plan.repeats + 2)
    return torch.stack(rows).cpu(), seconds


def hf_section(path: Path, plan: Plan) -> tuple[dict, torch.Tensor]:
    """HF last-token logits of the parity prompts and its prefill speed; the model is freed."""
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, plan.dtype)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
    rows, seconds = _hf_measure(model.to(plan.device).eval(), plan)
    del model
    gc.collect()
    if plan.device == "cuda":
        torch.cuda.empty_cache()
    n, length = plan.prefill
    return {"tokens_per_s": n * length / seconds, "seconds": seconds}, rows


# ---------------------------------------------------------------- kvgate


def _compile_counter() -> tuple[list[str], Callable[[], None]]:
    """Count Triton compilations (in-process cache misses) from now on; returns (log, stop)."""
    import triton

    seen: list[str] = []

    def hook(**kwargs: Any) -> bool:
        seen.append(str(kwargs.get("repr", "")))
        return False

    triton.knobs.runtime.jit_cache_hook = hook

    def stop() -> None:
        triton.knobs.runtime.jit_cache_hook = None

    return seen, stop


def startup_section(path: Path, plan: Plan) -> tuple[ModelRunner, dict]:
    config = EngineConfig(device=plan.device, dtype="auto" if plan.device == "cuda" else plan.dtype,
                          max_num_seqs=64, kv_cache_bytes=None if plan.device == "cuda" else
                          plan.kv_bytes)  # fmt: skip
    start = time.perf_counter()
    runner = ModelRunner.from_pretrained(path, config)
    load_s = time.perf_counter() - start
    result: dict[str, Any] = {"load_total_s": load_s, "num_blocks": runner.num_blocks,
                              "dtype": str(runner.decoder.dtype)}  # fmt: skip
    if plan.device != "cuda":
        result["warmup_s"] = runner.warm_up().seconds  # the CPU runner skips it at load
        return runner, result
    result.update(runner.startup)
    seen, stop = _compile_counter()
    rng = random.Random(3)
    prefix = [rng.randrange(10, 150_000) for _ in range(600)]
    prompts = [prefix + [rng.randrange(10, 150_000) for _ in range(rng.randrange(1, 200))]
               for _ in range(40)]  # fmt: skip
    prompts += _prompts((1, 70, 900, 3000), plan.geometry.vocab, 4)
    engine = Engine(EngineCore(runner, config))
    engine.generate(prompts, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    stop()
    result["compilations_after_startup"] = len(seen)
    result["compiled_after_startup"] = sorted(set(seen))[:20]
    return runner, result


def parity_section(runner: ModelRunner, plan: Plan, hf_rows: torch.Tensor) -> dict:
    prompts = _prompts(plan.prompt_lens, plan.geometry.vocab, 1)
    _, logits = runner.compute_logits(ScheduledBatch(_seqs(prompts, runner.block_size)))
    ours = logits.float().cpu()
    diff = (ours - hf_rows).abs()
    return {
        "prompt_lens": list(plan.prompt_lens),
        "max_abs_diff": float(diff.max()),
        "mean_abs_diff": float(diff.mean()),
        "top1_agreement": float((ours.argmax(-1) == hf_rows.argmax(-1)).float().mean()),
    }


def prefill_section(runner: ModelRunner, plan: Plan, hf: dict) -> dict:
    n, length = plan.prefill
    batch = ScheduledBatch(_seqs(_prompts([length] * n, plan.geometry.vocab, 2), runner.block_size))
    seconds = _median_time(lambda: runner.compute_logits(batch), plan.device, plan.repeats + 2)
    ours = n * length / seconds
    peer = hf["tokens_per_s"]
    return {"prompts": n, "tokens_each": length, "kvgate_tokens_per_s": ours,
            "hf_sdpa_tokens_per_s": peer, "ratio_vs_hf": ours / peer}  # fmt: skip


def _decode_rate(runner: ModelRunner, plan: Plan, batch_size: int) -> float:
    ctx = plan.decode_context
    prompts = _prompts([ctx] * batch_size, plan.geometry.vocab, 5)
    seqs = _seqs([p + [0] * (plan.decode_steps + 1) for p in prompts], runner.block_size)
    runner.compute_logits(ScheduledBatch([
        ScheduledSeq(s.request_id, s.token_ids[:ctx], 0, s.block_table, True, GREEDY)
        for s in seqs]))  # fmt: skip

    def steps() -> None:
        for step in range(plan.decode_steps):
            runner.execute(ScheduledBatch([
                ScheduledSeq(s.request_id, [7], ctx + step, s.block_table, True, GREEDY)
                for s in seqs]))  # fmt: skip

    steps()  # first pass: allocator, caches
    seconds = _median_time(steps, plan.device, plan.repeats)
    return batch_size * plan.decode_steps / seconds


def decode_section(runner: ModelRunner, plan: Plan) -> dict:
    graphs = runner.graphs
    result: dict[str, Any] = {"context": plan.decode_context, "steps": plan.decode_steps}
    for b in plan.decode_batches:
        row: dict[str, Any] = {}
        if graphs is not None:
            before = graphs.replays
            row["graphs_tokens_per_s"] = _decode_rate(runner, plan, b)
            row["graph_replays"] = graphs.replays - before
        runner.graphs = None
        row["eager_tokens_per_s"] = _decode_rate(runner, plan, b)
        runner.graphs = graphs
        if graphs is not None:
            row["graphs_speedup"] = row["graphs_tokens_per_s"] / row["eager_tokens_per_s"]
        result[f"batch_{b}"] = row
    return result


def burst_section(path: Path, plan: Plan) -> dict:
    requests, system_len, turn_len, output = plan.burst
    kw: dict[str, Any] = {"device": plan.device, "kv_cache_bytes": plan.kv_bytes,
                          "clock": time.perf_counter, "max_num_seqs": 64}  # fmt: skip
    if plan.device != "cuda":
        kw["dtype"] = plan.dtype
    params = SamplingParams(max_tokens=output, temperature=0.0, ignore_eos=True)
    rng = random.Random(0)
    out: dict[str, Any] = {"requests": requests, "system_len": system_len, "turn_len": turn_len}
    for name, reuse in (("early_reuse", True), ("reuse_off", False)):
        eng = Engine.from_pretrained(path, enable_prefix_reuse=reuse, **kw)
        runs = []
        for rep in range(plan.repeats):
            system = [rng.randrange(10, plan.geometry.vocab - 1) for _ in range(system_len)]
            prompts = [system + [rng.randrange(10, plan.geometry.vocab - 1)
                                 for _ in range(turn_len)] for _ in range(requests)]  # fmt: skip
            runs.append(_burst(eng, prompts, params, f"rep{rep}"))
        out[name] = {k: statistics.median(r[k] for r in runs)
                     for k in ("ttft_p50", "ttft_p90", "wall_total")}  # fmt: skip
        del eng
        gc.collect()
        if plan.device == "cuda":
            torch.cuda.empty_cache()
    out["ttft_p50_speedup"] = out["reuse_off"]["ttft_p50"] / out["early_reuse"]["ttft_p50"]
    return out


def run(plan: Plan, out: Path, dry_run: bool) -> dict:
    path = Path(f"/tmp/kvgate-gpu-engine-{plan.geometry.hidden}-L{plan.layers}")
    if not (path / "model.safetensors").exists():
        make_random_model(path, layers=plan.layers, geometry=plan.geometry, dtype=plan.dtype)
    name = torch.cuda.get_device_name() if plan.device == "cuda" else "cpu"
    result: dict[str, Any] = {"dry_run": dry_run, "config": {
        "model": plan.geometry.describe(plan.layers), "device": plan.device, "dtype": plan.dtype,
        "device_name": name}}  # fmt: skip
    hf, hf_rows = hf_section(path, plan)
    runner, result["startup"] = startup_section(path, plan)
    result["parity"] = parity_section(runner, plan, hf_rows)
    result["prefill"] = prefill_section(runner, plan, hf)
    result["decode"] = decode_section(runner, plan)
    del runner
    gc.collect()
    if plan.device == "cuda":
        torch.cuda.empty_cache()
    result["burst"] = burst_section(path, plan)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))
    return result


def main(argv: Sequence[str]) -> int:
    args = _args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("python -m bench.gpu_engine: needs a CUDA device (or --dry-run)")
        return 2
    plan = DRY_PLAN if args.dry_run else GPU_PLAN
    name = "gpu_engine_dry_run.json" if args.dry_run else "gpu/engine.json"
    run(plan, args.out or RESULTS_DIR / name, args.dry_run)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
