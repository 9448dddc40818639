"""The one dispatch point for paged-KV ops: CPU tensors -> torch reference, CUDA -> Triton.

```python
store_kv(key, value, k_cache, v_cache, slot_mapping)       # key/value [T, Hkv, D]
paged_attention(q, k_cache, v_cache, meta, scale) -> out   # q/out [T, Hq, D]
rms_norm(x, weight, eps[, residual]) -> out | (out, sum)   # x [rows, hidden]
rope_store_kv(q, k, v, positions, cos, sin, k_cache, v_cache, slot_mapping)
check_step(meta, k_cache, v_cache, num_tokens) -> meta     # validated once per step
```
``rms_norm`` with ``residual`` normalises ``residual + x`` and also returns that sum (``residual``
may be overwritten with it); ``rope_store_kv`` rotates q in place and writes rotated k and v into
the cache (k itself may be left unrotated). The Triton kernels are imported only when a CUDA
tensor arrives (no import-time side effects, and CPU-only installs never touch Triton). CUDA
tensors go to ``engine.kernels.triton``: its ``store_kv``, ``rms_norm``, ``rope_store_kv``, and its
``paged_attention``, which picks per batch cascade attention (requests share
``meta.num_shared_blocks`` leading blocks and ``use_cascade`` says it pays), decode attention
(``meta.is_decode_only``) or extend attention (everything else).
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from typing import Any

import torch

from engine.kernels import reference
from engine.kernels.metadata import AttentionMetadata

__all__ = [
    "AttentionMetadata",
    "check_step",
    "paged_attention",
    "rms_norm",
    "rope_store_kv",
    "store_kv",
]


@cache
def _triton() -> Any:
    """The Triton kernels (``engine.kernels.triton``), imported on first use."""
    from engine.kernels import triton as triton_ops

    return triton_ops


def _on_triton(t: torch.Tensor) -> bool:
    """Whether ``t``'s op runs as a Triton kernel (tests route CPU tensors there, interpreted)."""
    return t.is_cuda


def check_step(
    meta: AttentionMetadata, k_cache: torch.Tensor, v_cache: torch.Tensor, num_tokens: int
) -> AttentionMetadata:
    """Validate one step's metadata against the cache once, for every layer: the Triton path
    returns it marked ``checked`` (its kernels then skip their per-call checks)."""
    if not _on_triton(k_cache):
        return meta
    ops = _triton()
    ops.check_kv_cache(k_cache, v_cache)
    ops.check_metadata(meta, k_cache, num_tokens)
    return replace(meta, checked=True)


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write new K/V [T, Hkv, D] into their cache slots (flat ``block_id * block_size + off``)."""
    if _on_triton(key):
        _triton().store_kv(key, value, k_cache, v_cache, slot_mapping)
    else:
        reference.store_kv(key, value, k_cache, v_cache, slot_mapping)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Causal attention of q [T, Hq, D] through the block tables; returns [T, Hq, D]."""
    if _on_triton(q):
        return _triton().paged_attention(q, k_cache, v_cache, meta, scale)
    return reference.paged_attention(q, k_cache, v_cache, meta, scale)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of x [rows, hidden]; with ``residual``, of ``residual + x``: (normed, sum)."""
    ops = _triton() if _on_triton(x) else reference
    return ops.rms_norm(x, weight, eps, residual)


def rope_store_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Rotary embedding of q (in place) and k by ``cos/sin[positions]``; rotated k and v [T, Hkv,
    D] written into their cache slots, all before any attention of the layer reads the cache."""
    fused = _on_triton(q) and _triton().rope_supports(q.shape[-1])
    ops = _triton() if fused else reference  # head dims the kernel does not tile: torch RoPE
    ops.rope_store_kv(q, k, v, positions, cos, sin, k_cache, v_cache, slot_mapping)
