"""Raw logits of every sampled step of a request, recorded at the sampler's input.

Also runnable in a fresh process (another run, another address layout)::

    python -m tests.engine._logits MODEL_DIR OUT.pt [THREADS]

writes ``{"tokens", "logits", "torch_isa", "gemm_isa"}`` of ``PROMPT`` alone in a fresh engine
(prefix reuse off, ``STEPS`` greedy tokens) to OUT.pt.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from engine import Engine
from engine.outputs import RequestOutput, TokenLogprob
from engine.params import SamplingParams

STEPS = 6
PROMPT = [random.Random(5).randrange(3, 2000) for _ in range(300)]
# Between runs that compute a row differently (a cached prefix, another batch, another ISA or
# thread count): float32 reassociation, measured up to about 1.5e-6 on the test models' logits
# (docs/contracts.md, "Determinism"); the tolerance leaves a margin of over 6x.
LOGITS_ATOL = 1e-5
LOGPROB_ATOL = 1e-5


def greedy(steps: int = STEPS, **kw: Any) -> SamplingParams:
    return SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True, **kw)


def generate_with_logits(
    engine: Engine,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    namespace: str = "default",
) -> list[tuple[RequestOutput, torch.Tensor]]:
    """Each request's output and its logits [tokens, vocab], one row per sampled step."""
    runner = engine.core.runner
    inner = runner.sampler
    rows: dict[str, list[torch.Tensor]] = {}

    def recording(logits: torch.Tensor, *args: Any) -> Any:
        request_ids = args[3]
        for i, rid in enumerate(request_ids):
            rows.setdefault(rid, []).append(logits[i].clone())
        return inner(logits, *args)

    runner.sampler = recording
    try:
        outs = engine.generate([list(p) for p in prompts], params, namespace=namespace)
    finally:
        runner.sampler = inner
    return [(out, torch.stack(rows[out.request_id])) for out in outs]


def assert_logprobs_close(got: Sequence[TokenLogprob], want: Sequence[TokenLogprob]) -> None:
    """The same tokens and top-k token ids exactly, their logprobs within ``LOGPROB_ATOL``: for
    runs of one request whose cache state or batch differed."""
    assert [(e.token_id, [t for t, _ in e.top]) for e in got] == [
        (e.token_id, [t for t, _ in e.top]) for e in want
    ]
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        values = [g.logprob, *(lp for _, lp in g.top)]
        wanted = [w.logprob, *(lp for _, lp in w.top)]
        diff = max(abs(a - b) for a, b in zip(values, wanted, strict=True))
        assert diff <= LOGPROB_ATOL, f"entry {i}: logprobs differ by {diff:.3g}"


def fresh_engine(model_dir: Path, reuse: bool = False) -> Engine:
    """The float32 path (``dtype=auto`` would be bfloat16 on a CPU with bf16 units), whose
    tolerances ``LOGITS_ATOL`` / ``LOGPROB_ATOL`` are."""
    return Engine.from_pretrained(
        model_dir,
        block_size=16,
        kv_cache_bytes=64 << 20,
        enable_prefix_reuse=reuse,
        device="cpu",
        dtype="float32",
    )


def main(argv: Sequence[str]) -> int:
    model_dir, out_path = Path(argv[0]), Path(argv[1])
    if len(argv) > 2:
        torch.set_num_threads(int(argv[2]))
    from engine.runtime.kernels.cpu import gemm

    ((out, logits),) = generate_with_logits(fresh_engine(model_dir), [PROMPT], greedy())
    kernel = gemm.load()
    torch.save(
        {
            "tokens": list(out.token_ids),
            "logits": logits,
            "torch_isa": torch.backends.cpu.get_cpu_capability(),
            "gemm_isa": None if kernel is None else kernel.isa,
        },
        out_path,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
