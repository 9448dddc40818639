"""The one dispatch point for paged-KV ops: CPU tensors -> torch reference, CUDA -> Triton.

```python
store_kv(key, value, k_cache, v_cache, slot_mapping)       # key/value [T, Hkv, D]
paged_attention(q, k_cache, v_cache, meta, scale) -> out   # q/out [T, Hq, D]
```
The Triton kernels are imported only when a CUDA tensor arrives (no import-time side effects, and
CPU-only installs never touch Triton). CUDA tensors go to ``engine.kernels.triton``: its
``store_kv``, and its ``paged_attention``, which picks per batch cascade attention (requests share
``meta.num_shared_blocks`` leading blocks and ``use_cascade`` says it pays), decode attention
(``meta.is_decode_only``) or extend attention (everything else).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import torch

from engine.kernels import reference
from engine.kernels.metadata import AttentionMetadata

__all__ = ["AttentionMetadata", "paged_attention", "store_kv"]


@cache
def _cuda_ops() -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(store_kv, paged_attention) for CUDA tensors: the Triton kernels, imported on first use."""
    from engine.kernels import triton as triton_ops

    return triton_ops.store_kv, triton_ops.paged_attention


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write new K/V [T, Hkv, D] into their cache slots (flat ``block_id * block_size + off``)."""
    if key.is_cuda:
        _cuda_ops()[0](key, value, k_cache, v_cache, slot_mapping)
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
    if q.is_cuda:
        return _cuda_ops()[1](q, k_cache, v_cache, meta, scale)
    return reference.paged_attention(q, k_cache, v_cache, meta, scale)
