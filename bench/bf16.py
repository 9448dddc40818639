"""``kvgate bench bf16``: the CPU's bf16 path against float32 and transformers, and its speed.

One prompt (``--prompt`` through the model's chat template where it has one, else random ids),
``--steps`` greedy steps of kvgate's float32 path; every side computes the logits of those same
steps (teacher forcing: the prompt's prefill, then one decode step per token):

- kvgate bf16 with the default float32 KV cache and attention (``kv_dtype`` auto), and with
  ``kv_dtype=bfloat16`` (KV cache, attention and norms in bf16 too);
- transformers in bf16 and in float32 (the same checkpoint).

Reported per side: the largest |difference| of the top-5 log-probabilities from float32's (and
kvgate's from transformers' bf16), the steps whose argmax is float32's token (and transformers'
bf16 argmax), and, running free, how many greedy tokens equal float32's before the first that
differs; and the wall time of kvgate's prefill and decode steps on ``--threads`` threads. On a
CPU without bf16 units kvgate's bf16 is torch's reference (slow); the times say so, the
tolerances hold either way. A real checkpoint (``--model-dir``) gives meaningful figures; random
weights (the default: the reference geometry, ``--layers`` layers) give near-uniform logits.
Results: bench/results/bf16.json.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.common import cpu_model, model_dir, result_file, write_json
from engine.config import EngineConfig
from engine.core.batch import ScheduledBatch, ScheduledSeq
from engine.params import SamplingParams
from engine.runtime import cpu_isa
from engine.runtime.model.config import parse_config
from engine.runtime.model.kv_memory import block_bytes
from engine.runtime.runner import ModelRunner

RESULTS = Path(__file__).parent / "results" / "bf16.json"
GREEDY = SamplingParams(temperature=0.0, max_tokens=1 << 20)
BLOCK = 16
PROMPT = "My rocket order 4711 has not arrived"


def runner(path: Path, dtype: str, kv_dtype: str = "auto", blocks: int = 64) -> ModelRunner:
    """A CPU runner of ``blocks`` KV blocks of ``BLOCK`` tokens (sized as float32)."""
    per_block = block_bytes(parse_config(path), BLOCK, torch.float32)
    config = EngineConfig(
        block_size=BLOCK,
        kv_cache_bytes=blocks * per_block,
        dtype=dtype,
        kv_dtype=kv_dtype,
        device="cpu",
    )
    return ModelRunner.from_pretrained(path, config)


def _logits(run: ModelRunner, tokens: Sequence[int], start: int, table: list[int]) -> torch.Tensor:
    batch = ScheduledBatch([ScheduledSeq("a", list(tokens), start, table, True, GREEDY)])
    return run.compute_logits(batch)[1][0].float()


def trace(
    run: ModelRunner, prompt: list[int], steps: int, forced: list[int] | None = None
) -> tuple[list[int], torch.Tensor]:
    """``steps`` steps after ``prompt``: the tokens (greedy, or ``forced``) and the float32
    logits each step computed [steps, vocab]: the prompt's prefill, then one decode step per
    token."""
    table = list(range(-(-(len(prompt) + steps) // BLOCK)))
    rows = [_logits(run, prompt, 0, table)]
    tokens: list[int] = []
    for i in range(steps):
        tokens.append(int(rows[-1].argmax()) if forced is None else forced[i])
        if i + 1 < steps:
            rows.append(_logits(run, [tokens[-1]], len(prompt) + i, table))
    return tokens, torch.stack(rows)


def hf_trace(hf: Any, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """transformers' logits of the same steps, in one forward over prompt + tokens."""
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + tokens[:-1]])).logits[0, len(prompt) - 1 :]
    return logits.float()


def top5_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest |log-probability difference| over ``want``'s top 5 tokens of every step."""
    lg, lw = got.log_softmax(-1), want.log_softmax(-1)
    top = lw.topk(5, dim=-1).indices
    return (lg.gather(-1, top) - lw.gather(-1, top)).abs().max().item()


def agree(logits: torch.Tensor, tokens: list[int] | torch.Tensor) -> int:
    """Steps whose argmax is the given token."""
    return int((logits.argmax(-1) == torch.as_tensor(tokens)).sum())


def leading(got: list[int], want: list[int]) -> int:
    """Tokens equal before the first that differs."""
    return next((i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), len(want))


def _args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvgate bench bf16", description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", type=Path, default=None, help="an HF checkpoint directory")
    p.add_argument("--layers", type=int, default=4, help="random reference geometry's layers")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--prompt", default=PROMPT)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS)
    return p.parse_args(list(argv))


def _prompt(run: ModelRunner, text: str) -> list[int]:
    tok = run.tokenizer
    if tok.chat_template:
        return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))
    rng = random.Random(0)
    return [rng.randrange(10, run.vocab_size) for _ in range(64)]


def _kvgate_side(
    path: Path, kv_dtype: str, ref: dict[str, Any], steps: int
) -> dict[str, float | int]:
    run = runner(path, "bfloat16", kv_dtype)
    t0 = time.perf_counter()
    free, _ = trace(run, ref["prompt"], steps)
    seconds = time.perf_counter() - t0
    _, forced = trace(run, ref["prompt"], steps, ref["tokens"])
    return {
        "top5_vs_float32": top5_error(forced, ref["fp32"]),
        "argmax_is_float32_token": agree(forced, ref["tokens"]),
        "free_running_same_tokens": leading(free, ref["tokens"]),
        "top5_vs_transformers_bf16": top5_error(forced, ref["hf_bf16"]),
        "argmax_is_transformers_bf16_argmax": agree(forced, ref["hf_bf16"].argmax(-1)),
        "trace_s": seconds,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    path = model_dir(args.layers, args.model_dir)
    fp32_run = runner(path, "float32")
    prompt = _prompt(fp32_run, args.prompt)
    t0 = time.perf_counter()
    tokens, fp32 = trace(fp32_run, prompt, args.steps)
    fp32_s = time.perf_counter() - t0
    del fp32_run
    hf: dict[str, torch.Tensor] = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
        hf[str(dtype).removeprefix("torch.")] = hf_trace(model, prompt, tokens)
    ref = {"prompt": prompt, "tokens": tokens, "fp32": fp32, "hf_bf16": hf["bfloat16"]}
    sides = {kv: _kvgate_side(path, kv, ref, args.steps) for kv in ("auto", "bfloat16")}
    return {
        "benchmark": "bf16",
        "config": {
            "model": str(path),
            "prompt_tokens": len(prompt),
            "steps": args.steps,
            "threads": args.threads,
            "cpu": cpu_model(),
            "cpu_flags": cpu_isa.vector_flags(),
            "bf16_units": cpu_isa.native_bf16(),
        },
        "float32": {
            "trace_s": fp32_s,
            "top5_vs_transformers_float32": top5_error(fp32, hf["float32"]),
        },
        "transformers_bf16": {
            "top5_vs_float32": top5_error(hf["bfloat16"], fp32),
            "argmax_is_float32_token": agree(hf["bfloat16"], tokens),
        },
        "kvgate_bf16": sides["auto"],
        "kvgate_bf16_kv_bf16": sides["bfloat16"],
    }


def main(argv: Sequence[str]) -> int:
    args = _args(argv)
    result = run(args)
    print(json.dumps(result, indent=2))
    out = result_file(args.out, RESULTS)
    write_json(out, result)
    print(f"results written to {out}")
    return 0
