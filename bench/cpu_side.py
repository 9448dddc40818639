"""kvgate's side of ``bench/cpu_peer.py``, run in its own process: ``python -m bench.cpu_side
SPEC [WEIGHTS]`` prints one JSON line of figures (``Spec`` and the measured figures are shared
with ``bench/llama_side.py``, which reads the same JSON); WEIGHTS is EngineConfig's ``weights``
(default auto)."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

KV_TOKENS = 4096  # the KV cache kvgate is given: the peer's context length


@dataclass(frozen=True)
class Spec:
    model: str
    threads: int
    system: list[int]  # the tenant prompt's ids
    turns: list[list[int]]  # new user turns (ids after the tenant prompt)
    timed_turns: int
    decode_tokens: int
    conversations: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def conversation(model: Path, length: int, count: int) -> tuple[list[int], list[list[int]]]:
    """A tenant prompt of at least ``length`` tokens and ``count`` new user turns after it."""
    from bench.model import _conversation
    from engine.runtime.model.gguf import GGUFFile
    from engine.text.gguf_tokenizer import gguf_tokenizer

    f = GGUFFile.open(model)
    system, turn = _conversation(gguf_tokenizer(f.metadata, str(model)), length)
    return system, [turn(i)[len(system) :] for i in range(count)]


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _decode(engine: Any, prompts: list[list[int]], tokens: int) -> float:
    """Aggregate tokens/s of ``prompts`` decoding together, from the step where every one has
    its first token to the end."""
    from engine.params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    ids = {engine.add_request(p, params, namespace="tenant") for p in prompts}
    started: set[str] = set()
    t0, counted = 0.0, 0
    while engine.has_unfinished():
        outs = [o for o in engine.step() if o.request_id in ids]
        if len(started) == len(ids):
            counted += sum(len(o.new_token_ids) for o in outs)
        started |= {o.request_id for o in outs if o.token_ids}
        if len(started) == len(ids) and not t0:
            t0 = time.perf_counter()
    return counted / (time.perf_counter() - t0)


def measure(spec: Spec, weights: str = "auto") -> dict[str, float]:
    # The engine's process variables before torch loads, as in `kvgate worker`: with torch first,
    # its OpenMP threads spin beside the engine's kernel pool (OMP_WAIT_POLICY unset).
    import engine.runtime  # noqa: I001
    import torch

    from bench.models import read_model_config
    from engine.params import SamplingParams
    from engine.serving.engine import Engine

    torch.set_num_threads(spec.threads)
    before = rss_mb()
    start = time.perf_counter()
    cfg = read_model_config(Path(spec.model))
    kv_bytes = KV_TOKENS * 2 * cfg.num_layers * cfg.kv_size * 4  # float32 K and V
    engine = Engine.from_pretrained(spec.model, kv_cache_bytes=kv_bytes, weights=weights)
    startup = time.perf_counter() - start
    rss = rss_mb() - before - kv_bytes / 2**20
    one = SamplingParams(temperature=0.0, max_tokens=1)
    engine.pin_prefix("tenant", spec.system)
    engine.generate([spec.system + spec.turns[-1]], one, namespace="tenant")  # warm
    ttft = []
    for turn in spec.turns[: spec.timed_turns]:
        t0 = time.perf_counter()
        engine.generate([spec.system + turn], one, namespace="tenant")
        ttft.append(time.perf_counter() - t0)
    rest = spec.turns[spec.timed_turns :]
    single = _decode(engine, [spec.system + rest[0]], spec.decode_tokens)
    batch = [spec.system + t for t in rest[1 : 1 + spec.conversations]]
    aggregate = _decode(engine, batch, spec.decode_tokens)
    return {
        "startup_s": startup,
        "rss_mb": rss,
        "ttft_s": sorted(ttft)[len(ttft) // 2],
        "decode_tok_s": single,
        "aggregate_tok_s": aggregate,
    }


if __name__ == "__main__":
    print(json.dumps(measure(Spec(**json.loads(sys.argv[1])), *sys.argv[2:3])))
