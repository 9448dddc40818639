"""Token sampling: greedy, temperature, top-k, top-p, per-request seeds.

Seeded sampling is stateless: the generator of a step is seeded from ``(seed, num_generated)``, so a
request that is preempted and recomputed draws exactly the same tokens, whatever else is batched
with it. Unseeded requests draw from the process-wide generator.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.params import SamplingParams

_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: spreads nearby (seed, step) pairs apart
_MASK = (1 << 63) - 1


def step_seed(seed: int, num_generated: int) -> int:
    return (seed * _MIX + num_generated * 0xBF58476D1CE4E5B9 + 1) & _MASK


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[V] float32 logits -> temperature-scaled logits with top-k / top-p tails set to -inf."""
    x = logits / params.temperature
    if 0 < params.top_k < x.shape[-1]:
        kth = torch.topk(x, params.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, descending=True)
        probs = torch.softmax(sorted_x, dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop_sorted = (torch.cumsum(probs, dim=-1) - probs) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter_(0, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return x


def sample_one(logits: torch.Tensor, params: SamplingParams, num_generated: int) -> int:
    """One token from [V] float32 logits."""
    if params.greedy:
        return int(torch.argmax(logits))
    probs = torch.softmax(filter_logits(logits, params), dim=-1)
    gen = None
    if params.seed is not None:
        gen = torch.Generator(device=logits.device)
        gen.manual_seed(step_seed(params.seed, num_generated))
    return int(torch.multinomial(probs, 1, generator=gen))


def sample(
    logits: torch.Tensor, params: Sequence[SamplingParams], num_generated: Sequence[int]
) -> list[int]:
    """Row i of logits [N, V] -> one token with params[i]; greedy rows take one batched argmax."""
    if logits.shape[0] == 0:
        return []
    greedy = logits.argmax(dim=-1).tolist()
    return [
        greedy[i] if p.greedy else sample_one(logits[i], p, n)
        for i, (p, n) in enumerate(zip(params, num_generated, strict=True))
    ]
