"""Helpers shared by the engine benchmarks (reuse, burst, blocksize, load).

FLOP model of one forward (matmul FLOPs = 2 x multiply-adds), per layer and token at position p
(attending to p + 1 keys)::

    linear  2 * (h * (q + 2 kv) + q * h + 3 * h * inter)     q = heads * d, kv = kv_heads * d
    attn    2 * 2 * heads * d * (p + 1)                      (Q K^T and P V)
    logits  2 * h * vocab                                    only for tokens that sample

The same model prices the fair share's chunks (engine/core/step_cost.py, whose functions compute
it). The FLOP-ideal ratio of prefix reuse divides the FLOPs of the uncached tokens (attending to the
cached prefix) by the FLOPs of the whole prompt.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.models import QWEN25_05B, Geometry
from engine.core import step_cost

RESULTS_DIR = Path(__file__).parent / "results"


def model_dir(layers: int, explicit: Path | None = None) -> Path:
    """A random-weight Qwen2.5-0.5B-geometry model with ``layers`` layers (written once, reused)."""
    if explicit is not None:
        return explicit
    from bench.models import make_random_model

    path = Path(tempfile.gettempdir()) / f"kvgate-bench-qwen25-05b-L{layers}"
    if not (path / "model.safetensors").exists():
        make_random_model(path, layers=layers, dtype="float32")
    return path


def linear_flops(g: Geometry) -> int:
    return step_cost.linear_flops(g.hidden, g.heads, g.kv_heads, g.head_dim, g.intermediate)


def prefill_flops(
    start: int, end: int, layers: int, *, sampled: int = 1, g: Geometry = QWEN25_05B
) -> float:
    """FLOPs to compute tokens [start, end) with tokens [0, start) already cached."""
    n = end - start
    keys = (start + 1 + end) * n / 2  # sum of (p + 1) for p in [start, end)
    attn = step_cost.attention_flops_per_key(g.heads, g.head_dim) * keys
    return layers * (n * linear_flops(g) + attn) + sampled * 2 * g.hidden * g.vocab


def summarize(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def environment(threads: int) -> dict[str, Any]:
    return {
        "device": "cpu",
        "threads": threads,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


def cpu_isa() -> str:
    """torch's name for this CPU's vector ISA ("AVX512", "AVX2", ...): what a result ran on."""
    import torch

    return str(torch.backends.cpu.get_cpu_capability())


def cpu_model() -> str:
    """The CPU's model name with its family and model numbers (which tell a microarchitecture
    apart where a VM reports only "AMD EPYC"), from /proc/cpuinfo; the machine type elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return platform.machine()
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name", platform.machine())
    return f"{name} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')})"


def result_file(out: Path, default: Path) -> Path:
    """``--out`` as given, or ``default``'s file name inside it when it names a directory."""
    return out / default.name if out.is_dir() else out


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
        if n == 0:
            print("  ".join("-" * w for w in widths))


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)
