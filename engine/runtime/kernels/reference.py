"""Torch reference ops for the paged KV cache (the CPU path, and the ground truth for kernels).

Layout (see ``engine/runtime/kernels/metadata.py``)::

    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]
    slot = block_id * block_size + offset   ->   k_cache.view(-1, Hkv, D)[slot]

Attention reads every K/V through the block table, including the new tokens of this step, which
``store_kv`` has written first; so a request may read blocks that another request of the same
batch wrote in this very layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.runtime.kernels.metadata import AttentionMetadata


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write key/value [T, Hkv, D] into the flat slots ``slot_mapping`` [T] of the caches."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key.to(k_cache.dtype))
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value.to(v_cache.dtype))


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of x [rows, hidden]; with ``residual``, of ``residual + x``, returning (normed,
    sum). The sum is accumulated into ``residual`` in place (the caller's own buffer)."""
    h = x if residual is None else residual.add_(x)
    if h.dtype == torch.float32:
        normed = F.rms_norm(h, (h.shape[-1],), weight, eps)
    else:  # half precision: normalise in float32 and cast back before the weight, as HF does
        hf = h.float()
        normed = weight * (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)
    return normed if residual is None else (normed, h)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


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
    """Rotate q [T, Hq, D] in place by ``cos/sin[positions]`` (HF ``rotate_half`` layout, in the
    model dtype as HF does); write rotated k and v [T, Hkv, D] into their cache slots."""
    c, s = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)  # [T, 1, D]
    q.copy_(q * c + _rotate_half(q) * s)
    store_kv(k * c + _rotate_half(k) * s, v, k_cache, v_cache, slot_mapping)


def _gather(cache: torch.Tensor, blocks: torch.Tensor, length: int) -> torch.Tensor:
    """[length, Hkv, D] of one request's K or V, read through its block ids."""
    return cache.index_select(0, blocks).flatten(0, 1)[:length]


def _expand_kv(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[S, Hkv, D] -> [Hq, S, D]. Repeating K/V heads keeps SDPA on its fused CPU kernel, which
    ``enable_gqa=True`` would make fall back to the unfused math path."""
    groups = num_heads // x.shape[1]
    x = x.transpose(0, 1)
    return x if groups == 1 else x.repeat_interleave(groups, dim=0)


def _attend_one(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context_len: int, scale: float
) -> torch.Tensor:
    """q [n, Hq, D] at positions context_len.., k/v [S, Hkv, D] with S = context_len + n."""
    n = q.shape[0]
    if context_len == 0 or n == 1:
        # Fresh prompt: plain causal. One query at the end: it sees everything.
        # 4-D [1, H, S, D]: the fused CPU kernel only takes batched input.
        qh = q.transpose(0, 1).unsqueeze(0)
        kh, vh = _expand_kv(k, q.shape[1]).unsqueeze(0), _expand_kv(v, q.shape[1]).unsqueeze(0)
        out = F.scaled_dot_product_attention(
            qh, kh, vh, is_causal=context_len == 0 and n > 1, scale=scale
        )
        return out.squeeze(0).transpose(0, 1)
    return _attend_extend(q, k, v, context_len, scale)


def _attend_extend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context_len: int, scale: float
) -> torch.Tensor:
    """New tokens after a cached prefix, GQA without copying K/V per query head.

    The ``g`` query heads that share KV head ``h`` (heads ``h*g .. h*g+g-1``) become ``g*n`` query
    rows of that head, ordered (head in group, token); row ``r`` is token ``r % n`` at absolute
    position ``context_len + r % n`` and sees keys ``j <= context_len + r % n``."""
    n, hq, d = q.shape
    s, hkv = k.shape[0], k.shape[1]
    g = hq // hkv
    qg = q.view(n, hkv, g, d).permute(1, 2, 0, 3).reshape(1, hkv, g * n, d)
    kh, vh = k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)
    rows = (torch.arange(n, device=q.device) + context_len).repeat(g)
    mask = torch.arange(s, device=q.device).unsqueeze(0) <= rows.unsqueeze(1)
    out = F.scaled_dot_product_attention(qg, kh, vh, attn_mask=mask, scale=scale)
    return out.view(hkv, g, n, d).permute(2, 0, 1, 3).reshape(n, hq, d)


def _decode_batched(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """One query per request: gather all block tables at once and mask the padding.

    GQA without copying K/V per query head: the ``g`` query heads that share a KV head become
    ``g`` query rows of that head (no causal mask is needed for a single new token)."""
    bs = meta.block_size
    nb = (meta.max_seq_len + bs - 1) // bs
    tables = meta.block_tables[:, :nb].long()  # [B, nb]
    b, hq, d = q.shape
    hkv = k_cache.shape[2]
    k = k_cache[tables].flatten(1, 2).transpose(1, 2)  # [B, Hkv, nb*bs, D]
    v = v_cache[tables].flatten(1, 2).transpose(1, 2)
    keys = torch.arange(nb * bs, device=q.device)
    mask = (keys.unsqueeze(0) < meta.seq_lens.unsqueeze(1)).view(b, 1, 1, nb * bs)
    out = F.scaled_dot_product_attention(
        q.reshape(b, hkv, hq // hkv, d), k, v, attn_mask=mask, scale=scale
    )  # [B, Hkv, g, D]
    return out.reshape(b, hq, d)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Causal attention of q [T, Hq, D] over each request's cached + new K/V; returns [T, Hq, D]."""
    if meta.is_decode_only and meta.num_seqs > 1:
        return _decode_batched(q, k_cache, v_cache, meta, scale)
    out = torch.empty_like(q)
    starts = meta.query_start_loc.tolist()
    contexts = meta.context_lens.tolist()
    seq_lens = meta.seq_lens.tolist()
    bs = meta.block_size
    for i, (ctx, seq_len) in enumerate(zip(contexts, seq_lens, strict=True)):
        lo, hi = starts[i], starts[i + 1]
        if hi == lo:
            continue
        blocks = meta.block_tables[i, : (seq_len + bs - 1) // bs].long()
        k = _gather(k_cache, blocks, seq_len)
        v = _gather(v_cache, blocks, seq_len)
        out[lo:hi] = _attend_one(q[lo:hi], k, v, ctx, scale)
    return out
