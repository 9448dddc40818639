"""The one dispatch point for paged-KV ops: CPU tensors -> kvgate's C ops or the torch reference,
CUDA -> Triton.

```python
store_kv(key, value, k_cache, v_cache, slot_mapping)       # key/value [T, Hkv, D]
paged_attention(q, k_cache, v_cache, meta, scale) -> out   # q/out [T, Hq, D]
rms_norm(x, weight, eps[, residual]) -> out | (out, sum)   # x [rows, hidden]
rope_store_kv(q, k, v, positions, cos, sin, k_cache, v_cache, slot_mapping)
silu_mul(gate_up, inter) -> act                            # gate_up [T, 2 * inter] = [gate | up]
check_step(meta, k_cache, v_cache, num_tokens) -> meta     # validated once per step
```
``rms_norm`` with ``residual`` normalises ``residual + x`` and also returns that sum (``residual``
may be overwritten with it); ``rope_store_kv`` rotates q in place and writes rotated k and v into
the cache (k itself may be left unrotated). The Triton kernels are imported only when a CUDA
tensor arrives (no import-time side effects, and CPU-only installs never touch Triton). Float32
CPU tensors go to ``engine.runtime.kernels.cpu.ops`` where it is built (RMSNorm, RoPE + store, and
attention: decode and prefill), everything else on the CPU to ``reference``. CUDA
tensors go to ``engine.runtime.kernels.triton``: its ``store_kv``, ``rms_norm``, ``rope_store_kv``,
and its ``paged_attention``, which picks per batch cascade attention (requests share
``meta.num_shared_blocks`` leading blocks and ``use_cascade`` says it pays), decode attention
(``meta.is_decode_only``) or extend attention (everything else).
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from typing import Protocol, overload

import torch
import torch.nn.functional as F

from engine.runtime.kernels import reference
from engine.runtime.kernels.cpu import ops as cpu_ops
from engine.runtime.kernels.metadata import AttentionMetadata

__all__ = [
    "AttentionMetadata",
    "check_step",
    "paged_attention",
    "rms_norm",
    "rope_store_kv",
    "silu_mul",
    "store_kv",
]


class _Ops(Protocol):
    """The ops both backends implement (the modules ``reference`` and ``triton``: the type checker
    holds each module to these signatures)."""

    def store_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        /,
    ) -> None: ...

    def paged_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        /,
    ) -> torch.Tensor: ...

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None, /
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...

    def rope_store_kv(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        /,
    ) -> None: ...


class _TritonOps(_Ops, Protocol):
    """The Triton backend's extras: the once-per-step checks and the head dims RoPE tiles."""

    def check_kv_cache(self, k_cache: torch.Tensor, v_cache: torch.Tensor, /) -> None: ...

    def check_metadata(
        self, meta: AttentionMetadata, k_cache: torch.Tensor, num_tokens: int, /
    ) -> None: ...

    def rope_supports(self, head_dim: int, /) -> bool: ...


@cache
def _triton() -> _TritonOps:
    """The Triton kernels (``engine.runtime.kernels.triton``), imported on first use."""
    from engine.runtime.kernels import triton as triton_ops

    return triton_ops


def _on_triton(t: torch.Tensor) -> bool:
    """Whether ``t``'s op runs as a Triton kernel (tests route CPU tensors there, interpreted)."""
    return t.is_cuda


def _c_ops(*tensors: torch.Tensor) -> cpu_ops.CpuOps | None:
    """kvgate's C ops, when every tensor is a contiguous float32 CPU tensor and they are built."""
    return cpu_ops.default() if all(cpu_ops.plain_cpu(t) for t in tensors) else None


def _int32_rows(meta: AttentionMetadata) -> bool:
    """The metadata laid out as the C attention reads it."""
    rows = (meta.query_start_loc, meta.context_lens, meta.seq_lens)
    return (
        all(t.dtype == torch.int32 and t.is_contiguous() for t in rows)
        and meta.block_tables.dtype == torch.int32
        and meta.block_tables.stride(-1) == 1
    )


def check_step(
    meta: AttentionMetadata, k_cache: torch.Tensor, v_cache: torch.Tensor, num_tokens: int
) -> AttentionMetadata:
    """Validate one step's metadata against the cache once, for every layer, and return it marked
    ``checked`` where it passes (kernels then skip their per-call checks): on the CPU, laid out as
    the C attention reads it."""
    if not _on_triton(k_cache):
        return replace(meta, checked=True) if _int32_rows(meta) else meta
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
    c = _c_ops(q, k_cache, v_cache)
    if c is not None and c.attends(q.shape[-1]) and (meta.checked or _int32_rows(meta)):
        return c.paged_attention(q, k_cache, v_cache, meta, scale)
    return reference.paged_attention(q, k_cache, v_cache, meta, scale)


@overload
def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: None = None
) -> torch.Tensor: ...


@overload
def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]: ...


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of x [rows, hidden]; with ``residual``, of ``residual + x``: (normed, sum)."""
    if _on_triton(x):
        return _triton().rms_norm(x, weight, eps, residual)
    c = _c_ops(x, weight, *(() if residual is None else (residual,)))
    if c is not None and (residual is None or residual.shape == x.shape):
        return c.rms_norm(x, weight, eps, residual)
    return reference.rms_norm(x, weight, eps, residual)


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
    c = _c_ops(cos, sin, k_cache, v_cache) if not _on_triton(q) else None
    fused_qkv = cpu_ops.rope_operands(q, k, v) if c is not None else None
    if (
        c is not None
        and fused_qkv is not None
        and q.dtype == torch.float32
        and positions.dtype == slot_mapping.dtype == torch.int64
        and positions.is_contiguous()
        and slot_mapping.is_contiguous()
    ):
        qkv, heads = fused_qkv
        c.rope_store_kv(qkv, heads, positions, cos, sin, k_cache, v_cache, slot_mapping)
        return
    fused = _on_triton(q) and _triton().rope_supports(q.shape[-1])
    ops: _Ops = _triton() if fused else reference  # head dims the kernel does not tile: torch RoPE
    ops.rope_store_kv(q, k, v, positions, cos, sin, k_cache, v_cache, slot_mapping)


def silu_mul(gate_up: torch.Tensor, inter: int) -> torch.Tensor:
    """The MLP activation ``silu(gate) * up`` of ``gate_up`` [T, 2 * inter] ([gate | up]); the
    result may reuse ``gate_up``'s memory."""
    c = _c_ops(gate_up) if gate_up.dim() == 2 else None
    if c is not None:
        return c.silu_mul(gate_up, inter)
    gate, up = gate_up.split_with_sizes((inter, inter), dim=-1)
    return F.silu(gate, inplace=True).mul_(up)  # in place: the fused output is a temporary
