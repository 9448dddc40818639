"""Weights kept in a GGUF block format (Q4_1, Q8_0) instead of dequantized.

A row is an output; its inputs run in blocks of 32 weights that share a float16 scale ``d``
(and, in Q4_1, an offset ``m``): weight = d * q + m, q in 0..15 (Q4_1), or d * q, q int8 (Q8_0).
The GGUF loader keeps tensors of these types as :class:`BlockWeight` where the CPU block GEMM
runs (``engine/runtime/kernels/cpu/qgemm.py``); a linear packs it for that kernel, the embedding
dequantizes only the rows it looks up, and anything else dequantizes it once
(:meth:`BlockWeight.dequantize`, the same values ``gguf.quants.dequantize`` gives).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

QBLOCK = 32
Q4_1, Q8_0 = "q4_1", "q8_0"
BLOCK_BYTES = {Q4_1: 20, Q8_0: 34}  # GGUF's bytes per block of 32


@dataclass(frozen=True)
class BlockWeight:
    kind: str  # Q4_1 | Q8_0
    q: torch.Tensor  # [n, k]: uint8 0..15 (Q4_1) or int8 (Q8_0)
    d: torch.Tensor  # [n, k / 32] float16
    m: torch.Tensor | None  # [n, k / 32] float16 (Q4_1 only)

    @classmethod
    def from_gguf(cls, kind: str, raw: np.ndarray, shape: tuple[int, int]) -> BlockWeight:
        """``raw``: the tensor's bytes as the GGUF reader gives them, [n, k / 32 * block bytes]."""
        n, k = shape
        blocks = torch.from_numpy(np.array(raw, dtype=np.uint8)).view(
            n, k // QBLOCK, BLOCK_BYTES[kind]
        )
        d = blocks[..., 0:2].contiguous().view(torch.float16).view(n, -1)
        if kind == Q8_0:
            return cls(kind, blocks[..., 2:].contiguous().view(torch.int8).view(n, k), d, None)
        m = blocks[..., 2:4].contiguous().view(torch.float16).view(n, -1)
        nibbles = blocks[..., 4:]  # byte j: weight j (low nibble) and weight j + 16 (high)
        q = torch.cat((nibbles & 15, nibbles >> 4), dim=-1).reshape(n, k)
        return cls(kind, q, d, m)

    @property
    def shape(self) -> tuple[int, int]:
        n, k = self.q.shape
        return n, k

    @property
    def device(self) -> torch.device:
        return self.q.device

    def dequantize(self, rows: torch.Tensor | None = None, offset: bool = True) -> torch.Tensor:
        """Float32 [n, k] (or only ``rows``); without ``offset``, ``d * q`` alone (Q4_1's ``m``
        left out)."""
        q, d, m = self.q, self.d, self.m if offset else None
        if rows is not None:
            q, d = q.index_select(0, rows), d.index_select(0, rows)
            m = None if m is None else m.index_select(0, rows)
        w = q.float().view(q.shape[0], -1, QBLOCK) * d.float().unsqueeze(-1)
        if m is not None:
            w += m.float().unsqueeze(-1)
        return w.view(q.shape)

    def map_rows(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> BlockWeight:
        """The same weight with its rows rearranged by ``fn`` (applied to q, d and m alike)."""
        return BlockWeight(
            self.kind, fn(self.q), fn(self.d), None if self.m is None else fn(self.m)
        )


def cat_rows(parts: Sequence[torch.Tensor | BlockWeight]) -> torch.Tensor | BlockWeight:
    """Weights stacked along their outputs; in one block format when all share it, float32 else."""
    kinds = {p.kind if isinstance(p, BlockWeight) else None for p in parts}
    if len(kinds) == 1 and None not in kinds:
        blocks = [p for p in parts if isinstance(p, BlockWeight)]
        m = [b.m for b in blocks]
        return BlockWeight(
            blocks[0].kind,
            torch.cat([b.q for b in blocks]),
            torch.cat([b.d for b in blocks]),
            None if any(x is None for x in m) else torch.cat([x for x in m if x is not None]),
        )
    return torch.cat([as_tensor(p) for p in parts])


def as_tensor(w: torch.Tensor | BlockWeight) -> torch.Tensor:
    return w.dequantize() if isinstance(w, BlockWeight) else w


def embed(weight: torch.Tensor | BlockWeight, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` of an embedding table, dequantized alone when it is kept in blocks."""
    if isinstance(weight, BlockWeight):
        return weight.dequantize(ids)
    return torch.nn.functional.embedding(ids, weight)
