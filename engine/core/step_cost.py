"""What a scheduled chunk costs the model: the unit of the fair share (no torch).

A chunk is ``k`` tokens of one request at positions ``[p, p + k)``; each attends to every key
before it and itself, so token ``p + i`` reads ``p + i + 1`` keys (a cached prefix included:
reusing it skips computing its K/V, never reading them). Its FLOPs over the model's ``L``
layers (matmul FLOPs = 2 x multiply-adds; bench/common.py's model)::

    linear  L * 2 * (h * (q + 2 kv) + q * h + 3 * h * inter) * k    q = heads * d, kv = kv_heads * d
    attn    L * 2 * 2 * heads * d * keys        keys = sum(p + i + 1, i < k) = k p + k (k + 1) / 2
    logits  2 * h * vocab                       once, if the chunk ends in a sampled token

``StepCost`` keeps the three weights divided by the linear term of one token, so a cost is in
*token equivalents* (a token with no context and no sampling costs 1) and the fair share's
counters keep their scale: ``cost = k * per_token + keys * per_key + sampled * per_sample``.
A decode row over a long cached context then costs what its attention costs, where counting
tokens charged every decode 1 (SmolLM2-135M's geometry: 2.9 over 5,000 keys, 1.3 over 100).

Norms, RoPE, the embedding lookup and the step's fixed cost are left out (small, or nobody's).
FLOPs are what compute-bound steps (prefill) take; a decode step is bound by memory traffic
(weights read once for all rows, each row's K/V read for itself), where a long context costs
more than its FLOPs say: the model is the geometry's, not one machine's (docs/contracts.md).
"""

from __future__ import annotations

from dataclasses import dataclass


def linear_flops(hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int) -> int:
    """FLOPs of one token through one layer's projections and MLP (q/k/v, o, gate/up/down)."""
    q, kv = heads * head_dim, kv_heads * head_dim
    return 2 * (hidden * (q + 2 * kv) + q * hidden + 3 * hidden * intermediate)


def attention_flops_per_key(heads: int, head_dim: int) -> int:
    """FLOPs of one token's attention to one key in one layer (Q K^T and P V)."""
    return 2 * 2 * heads * head_dim


@dataclass(frozen=True)
class StepCost:
    """Weights of a chunk's cost, in token equivalents. The default counts tokens (no context,
    no sampling term): what a scheduler built without a model (tests of its logic) charges."""

    per_token: float = 1.0
    per_key: float = 0.0  # per key a token attends to
    per_sample: float = 0.0  # the LM head of a sampled token

    def __post_init__(self) -> None:
        if not self.per_token > 0 or self.per_key < 0 or self.per_sample < 0:
            raise ValueError(f"a step cost needs per_token > 0 and no negative weight: {self}")

    @classmethod
    def from_geometry(
        cls,
        *,
        hidden: int,
        layers: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        intermediate: int,
        vocab: int,
    ) -> StepCost:
        """The weights of a decoder of this geometry (the module docstring's FLOP model)."""
        token = layers * linear_flops(hidden, heads, kv_heads, head_dim, intermediate)
        return cls(
            per_token=1.0,
            per_key=layers * attention_flops_per_key(heads, head_dim) / token,
            per_sample=2 * hidden * vocab / token,
        )

    def chunk(self, start: int, tokens: int, sampled: bool) -> float:
        """Cost of computing ``tokens`` tokens at positions ``[start, start + tokens)``."""
        keys = tokens * start + tokens * (tokens + 1) // 2
        return tokens * self.per_token + keys * self.per_key + (self.per_sample if sampled else 0)

    def to_finish(self, tokens: int, outputs_left: int) -> float:
        """At most what a request still costs: its ``tokens`` (prompt and output so far) computed
        from position 0 (nothing cached), then ``outputs_left`` decodes, each sampled."""
        return self.chunk(0, tokens + outputs_left, False) + outputs_left * self.per_sample
