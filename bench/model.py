"""``kvgate bench model``: prefill and decode tokens/s, kvgate vs HF transformers, same weights.

Random weights of the Qwen2.5-0.5B geometry (4 layers on the CPU by default), float32; or a real
model with ``--model`` (an HF directory or a ``.gguf`` file, which transformers' GGUF loader reads
too: both dequantize the same tensors).
- prefill: B prompts of ``--prompt-len`` tokens, one forward, logits of the last token only
  (kvgate: ``execute`` with sampling rows only; HF: ``model(ids, logits_to_keep=1)``).
- decode: B requests with a ``--context``-token prompt, ``--steps`` greedy tokens each
  (kvgate: one ``execute`` per step; HF: ``generate(min_new_tokens=max_new_tokens)``, prefill
  subtracted by timing a 1-token generate of the same batch).
- TTFT (``--model`` only): a ``--tenant-prompt``-token tenant system prompt and a short user
  turn, one greedy token through ``Engine``: cold (a fresh namespace each time) vs pinned (the
  system prompt pinned once, a new user turn each time).
Each repeat measures both systems back to back; ratios are per repeat, reported as the median
with the min-max spread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from bench.models import QWEN25_05B, describe, make_random_model, read_model_config
from engine.config import EngineConfig
from engine.core.batch import ScheduledBatch, ScheduledSeq
from engine.params import SamplingParams
from engine.runtime.model.config import ModelConfig
from engine.runtime.runner import ModelRunner
from engine.serving.engine import Engine

GREEDY = SamplingParams(temperature=0.0, max_tokens=1 << 20)
RESULTS = Path(__file__).parent / "results" / "model.json"


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvgate bench model", description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=384)
    p.add_argument("--prefill-batches", type=_ints, default=[1, 7])
    p.add_argument("--decode-batches", type=_ints, default=[1, 8, 32])
    p.add_argument("--context", type=int, default=128, help="prompt tokens before decoding")
    p.add_argument("--steps", type=int, default=16, help="decode steps timed")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--block-size", type=int, default=16)
    # One thread by default: repeatable on a shared machine (both systems get the same).
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model-dir", type=Path, default=None, help="reuse an existing model dir")
    p.add_argument("--model", type=Path, default=None, help="a real model: HF dir or .gguf file")
    p.add_argument("--tenant-prompt", type=int, default=500, help="TTFT: system prompt tokens")
    p.add_argument("--out", type=Path, default=RESULTS)
    return p.parse_args(list(argv))


class _Kvgate:
    """Drives ModelRunner with hand-built batches (distinct block ranges per request)."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.bs = runner.block_size

    def _tables(self, batch: int, length: int) -> list[list[int]]:
        per = (length + self.bs - 1) // self.bs
        assert batch * per <= self.runner.num_blocks, "KV budget too small for the benchmark"
        return [list(range(i * per, (i + 1) * per)) for i in range(batch)]

    def prefill(self, prompts: list[list[int]], tables: list[list[int]]) -> list[int | None]:
        seqs = [
            ScheduledSeq(f"r{i}", p, 0, t, True, GREEDY)
            for i, (p, t) in enumerate(zip(prompts, tables, strict=True))
        ]
        return self.runner.execute(ScheduledBatch(seqs))

    def time_prefill(self, prompts: list[list[int]]) -> float:
        tables = self._tables(len(prompts), len(prompts[0]))
        t0 = time.perf_counter()
        self.prefill(prompts, tables)
        return time.perf_counter() - t0

    def time_decode(self, prompts: list[list[int]], steps: int) -> float:
        ctx = len(prompts[0])
        tables = self._tables(len(prompts), ctx + steps + 1)
        last = self.prefill(prompts, tables)
        t0 = time.perf_counter()
        for step in range(steps):
            seqs = [
                ScheduledSeq(f"r{i}", [last[i]], ctx + step, t, True, GREEDY, step + 1)
                for i, t in enumerate(tables)
            ]
            last = self.runner.execute(ScheduledBatch(seqs))
        return time.perf_counter() - t0


class _HF:
    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoModelForCausalLM

        where = {"gguf_file": model_dir.name} if model_dir.is_file() else {}
        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir.parent if where else model_dir,
            dtype=torch.float32,
            attn_implementation="sdpa",
            **where,
        ).eval()

    @torch.inference_mode()
    def time_prefill(self, prompts: list[list[int]]) -> float:
        ids = torch.tensor(prompts)
        t0 = time.perf_counter()
        self.model(ids, logits_to_keep=1)
        return time.perf_counter() - t0

    @torch.inference_mode()
    def _generate(self, ids: torch.Tensor, n: int) -> float:
        t0 = time.perf_counter()
        self.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
        )
        return time.perf_counter() - t0

    def time_decode(self, prompts: list[list[int]], steps: int) -> float:
        ids = torch.tensor(prompts)
        return self._generate(ids, steps + 1) - self._generate(ids, 1)


def _stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _measure(
    ours: Callable[[], float], theirs: Callable[[], float], tokens: int, repeats: int
) -> dict[str, dict[str, float]]:
    ours(), theirs()  # warm-up
    a, b = [], []
    for _ in range(repeats):
        a.append(tokens / ours())
        b.append(tokens / theirs())
    return {
        "kvgate_tok_s": _stats(a),
        "hf_tok_s": _stats(b),
        "ratio": _stats([x / y for x, y in zip(a, b, strict=True)]),
    }


def _prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (batch, length), generator=gen).tolist()


def run(args: argparse.Namespace, model_dir: Path) -> dict:
    need_tokens = max(
        max(args.prefill_batches) * args.prompt_len,
        max(args.decode_batches) * (args.context + args.steps + 1 + args.block_size),
    )
    cfg = read_model_config(model_dir)
    per_token = 2 * cfg.num_layers * cfg.kv_size * 4
    config = EngineConfig(block_size=args.block_size, kv_cache_bytes=2 * need_tokens * per_token)
    kv = _Kvgate(ModelRunner.from_pretrained(model_dir, config))
    hf = _HF(model_dir)
    # Random ids past the first special tokens; cost does not depend on them. The demo
    # tokenizer of a random model knows 2000.
    vocab = cfg.vocab_size if args.model is not None else 2000
    rows = []
    for b in args.prefill_batches:
        prompts = _prompts(b, args.prompt_len, vocab, seed=b)
        r = _measure(
            lambda p=prompts: kv.time_prefill(p),
            lambda p=prompts: hf.time_prefill(p),
            b * args.prompt_len,
            args.repeats,
        )
        rows.append({"phase": "prefill", "batch": b, **r})
        _print_row(rows[-1])
    for b in args.decode_batches:
        prompts = _prompts(b, args.context, vocab, seed=100 + b)
        r = _measure(
            lambda p=prompts: kv.time_decode(p, args.steps),
            lambda p=prompts: hf.time_decode(p, args.steps),
            b * args.steps,
            args.repeats,
        )
        rows.append({"phase": "decode", "batch": b, **r})
        _print_row(rows[-1])
    result = {"config": _config(args, cfg), "rows": rows}
    if args.model is not None:
        del kv, hf
        result["ttft"] = measure_ttft(model_dir, args)
    return result


POLICY = (
    "You are the support assistant of Rocket Shop, which sells model rockets and launch kits.",
    "Orders ship within two business days, and tracking numbers are emailed to the customer.",
    "Returns are accepted within 30 days for unused items in their original packaging.",
    "Never share customer data, and ask for the order number before discussing an order.",
)


def _conversation(tokenizer: Any, length: int) -> tuple[list[int], Callable[[int], list[int]]]:
    """A tenant system prompt of at least ``length`` tokens (policy sentences, chat-rendered)
    and a function giving prompt ``i``: that system prompt, then a new user turn."""
    render = tokenizer.apply_chat_template
    sentences: list[str] = []
    while True:
        sentences.append(POLICY[len(sentences) % len(POLICY)])
        system = {"role": "system", "content": " ".join(sentences)}
        system_text = render([system], add_generation_prompt=False)
        system_ids = tokenizer.encode(system_text)
        if len(system_ids) >= length:
            break

    def turn(i: int) -> list[int]:
        user = {"role": "user", "content": f"Where is my order {4700 + i}?"}
        text = render([system, user], add_generation_prompt=True)
        return system_ids + tokenizer.encode(text[len(system_text) :])

    return system_ids, turn


def measure_ttft(model: Path, args: argparse.Namespace) -> dict:
    """Seconds to the first token of a new turn after a tenant prompt: cold vs pinned."""
    engine = Engine.from_pretrained(model, block_size=args.block_size, kv_cache_bytes=256 << 20)
    system, turn = _conversation(engine.tokenizer, args.tenant_prompt)
    one = SamplingParams(temperature=0.0, max_tokens=1)

    def timed(namespace: str, i: int) -> float:
        t0 = time.perf_counter()
        engine.generate([turn(i)], one, namespace=namespace)
        return time.perf_counter() - t0

    timed("warm-up", 0)
    engine.pin_prefix("tenant", system)
    cold, pinned = [], []
    for i in range(1, args.repeats + 1):
        cold.append(timed(f"cold-{i}", i))
        pinned.append(timed("tenant", i))
    out = {
        "prompt_tokens": len(turn(1)),
        "tenant_prompt_tokens": len(system),
        "cold_s": _stats(cold),
        "pinned_s": _stats(pinned),
        "speedup": _stats([c / p for c, p in zip(cold, pinned, strict=True)]),
    }
    s = out["speedup"]
    print(
        f"TTFT {len(system)}-token tenant prompt: cold {out['cold_s']['median']:.3f} s, pinned "
        f"{out['pinned_s']['median']:.3f} s, {s['median']:.1f}x [{s['min']:.1f}-{s['max']:.1f}]",
        flush=True,
    )
    return out


def _config(args: argparse.Namespace, cfg: ModelConfig | None = None) -> dict:
    model = f"random Qwen2 ({QWEN25_05B.describe(args.layers)})"
    if args.model is not None and cfg is not None:
        model = f"{args.model.name} ({describe(cfg)}), dequantized to float32"
    return {
        "model": model,
        "dtype": "float32",
        "device": "cpu",
        "threads": args.threads,
        "block_size": args.block_size,
        "prompt_len": args.prompt_len,
        "decode_context": args.context,
        "decode_steps": args.steps,
        "repeats": args.repeats,
        "torch": torch.__version__,
    }


def _print_row(row: dict) -> None:
    k, h, r = row["kvgate_tok_s"], row["hf_tok_s"], row["ratio"]
    print(
        f"{row['phase']:<8} {row['batch']:>5} {k['median']:>12.1f} {h['median']:>12.1f} "
        f"{r['median']:>7.2f}x  [{r['min']:.2f}-{r['max']:.2f}]",
        flush=True,
    )


def main(argv: Sequence[str]) -> int:
    if "--peer" in argv:  # kvgate vs llama.cpp on the default model: bench/cpu_peer.py
        from bench import cpu_peer

        return cpu_peer.main(argv)
    args = _args(argv)
    torch.set_num_threads(args.threads)
    cfg = read_model_config(args.model) if args.model is not None else None
    print(json.dumps(_config(args, cfg), indent=2))
    print(
        f"{'phase':<8} {'batch':>5} {'kvgate tok/s':>12} {'HF tok/s':>12} {'ratio':>8}  [min-max]"
    )
    if args.model is not None or args.model_dir is not None:
        result = run(args, args.model or args.model_dir)
    else:
        with tempfile.TemporaryDirectory(prefix="kvgate-bench-model-") as tmp:
            model_dir = make_random_model(Path(tmp) / "model", layers=args.layers)
            result = run(args, model_dir)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"results written to {args.out}")
    return 0
