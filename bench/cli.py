"""``kvgate bench <name> [options]``: each benchmark is a module with ``main(argv) -> int``."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

BENCHMARKS: dict[str, tuple[str, str]] = {
    "kv": ("bench.kv", "prefix match + allocation on a warm 100k-block pool; scheduler churn"),
    "model": ("bench.model", "prefill/decode tokens/s vs HF transformers on the same weights"),
    "reuse": ("bench.reuse", "prefix reuse on vs off by batch size and common-prefix length"),
    "burst": ("bench.burst", "TTFT of a cold-cache burst sharing one system prompt"),
    "blocksize": ("bench.blocksize", "hit tokens and TTFT by block size 2..64"),
    "load": ("bench.load", "request-rate sweep through AsyncEngine, reuse on vs off"),
    "kernels": ("bench.kernels", "Triton kernels vs torch SDPA (GPU; CPU dry run)"),
    "gateway": ("bench.gateway", "gateway + limiter overhead vs AsyncEngine directly"),
    "limiter": (
        "bench.limiter",
        "Redis limiter acquire + release p50, beside another checkout",
    ),
    "cluster": ("bench.cluster", "tenant placement over worker processes vs round-robin, hash"),
    "tiers": ("bench.tiers", "host KV tier vs none, restore vs recompute, warm start from disk"),
    "bounds": ("bench.bounds", "largest allowed requests: logprobs memory, stop and n loop cost"),
    "ledger": ("bench.ledger", "usage ledger: records/s on PostgreSQL, chat p50 added, reports"),
    "fairness": ("bench.fairness", "another tenant's TTFT under one tenant's flood, FCFS vs fair"),
    "bias": ("bench.bias", "engine step time with an n-choice logit_bias request vs without"),
    "tools": (
        "bench.tools",
        "a tool loop run by the gateway vs a stateless client loop: time per round, prefill",
    ),
    "structured": (
        "bench.structured",
        "decode tok/s under a strict JSON schema vs unconstrained; mask and compile times",
    ),
    "conversations": (
        "bench.conversations",
        "ten-turn conversations: previous_response_id vs resending the history; TTFT, prefill",
    ),
    "vllm": ("bench.vllm_peer", "the seed shapes (reuse batch 1 and 7, burst) vs vLLM's CPU build"),
    "vllm-backend": (
        "bench.vllm_backend",
        "kvgate in front of vLLM servers: added TTFT; KV-event placement vs round-robin, hash",
    ),
    "bf16": ("bench.bf16", "the CPU's bf16 path vs float32 and transformers: top-5, greedy, time"),
}


def _usage() -> str:
    width = max(len(name) for name in BENCHMARKS)
    lines = ["usage: kvgate bench <name> [options]", "", "benchmarks:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in BENCHMARKS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    args = list(argv[1:])  # argv[0] is "bench"
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    name = args[0]
    if name not in BENCHMARKS:
        print(f"kvgate bench: unknown benchmark {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    # The engine's process variables (OMP_WAIT_POLICY=PASSIVE, the ISA caps) before any benchmark
    # loads torch, as `kvgate worker` has them: with torch first, its OpenMP threads spin beside
    # the engine's kernel pool and an in-process engine is timed slower than the worker runs.
    importlib.import_module("engine.runtime")
    module = importlib.import_module(BENCHMARKS[name][0])
    return int(module.main(args[1:]) or 0)
