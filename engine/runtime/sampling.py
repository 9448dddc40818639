"""Batched token sampling: one pass of tensor ops over every sampling row of a step.

Per row, in this order (each step only if some row of the batch uses it; branches are chosen from
the host-side parameters, never from tensor values, so nothing waits on the device)::

    raw logits -> grammar mask (constrained rows: disallowed tokens -inf; engine/runtime/grammar/)
      --log_softmax--> logprobs (sampled token + top-k, when asked; a constrained row's over the
                       tokens its grammar allows)
      -> repetition penalty (prompt + generated; /r above 0, *r below)
      -> presence / frequency penalties (generated tokens only)
      -> logit bias (``engine/runtime/logit_bias.py``: tensors built once per request)
      -> greedy rows: argmax                       (temperature 0 or top_k 1)
      -> / temperature -> min-p, top-k, top-p masks -> argmax(x + Gumbel noise)

Noise is a counter-based hash of (row key, token index) computed with int64 tensor ops, so a
row's draw depends only on its own key: a seeded row's key comes from (seed, tokens generated so
far), whatever else is batched and in which order, and a preempted request redraws the same
tokens. Unseeded rows take a key from torch's process-wide (CPU) generator. The step's results
(tokens, and logprobs when asked) reach the host with a single ``tolist()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from engine.outputs import TokenLogprob
from engine.params import SamplingParams
from engine.runtime import logit_bias
from engine.runtime.grammar.masks import PendingMask, StepMask
from engine.runtime.logit_bias import BiasEntries, LogitBiasTable
from engine.runtime.penalties import PenaltyCounts, apply_penalties, needs_penalties

_M32 = 0xFFFFFFFF
# Odd multipliers below 2**31: a 32-bit value times one stays below 2**63 (no int64 overflow).
_MUL_A = 0x7FEB352D
_MUL_B = 0x5BD1E995
_GOLDEN = 0x9E3779B9


@dataclass(frozen=True)
class SamplerOutput:
    tokens: list[int]
    logprobs: list[TokenLogprob | None] | None  # per row when any row asked, else None


def _mix32_(x: torch.Tensor) -> torch.Tensor:
    """Bijective 32-bit avalanche mix, in place, of int64 values in [0, 2**32)."""
    x ^= x >> 16
    x.mul_(_MUL_A).bitwise_and_(_M32)
    x ^= x >> 15
    x.mul_(_MUL_B).bitwise_and_(_M32)
    x ^= x >> 16
    return x


def _mix32_int(x: int) -> int:
    x ^= x >> 16
    x = (x * _MUL_A) & _M32
    x ^= x >> 15
    x = (x * _MUL_B) & _M32
    return x ^ (x >> 16)


def row_key(seed: int, step: int) -> tuple[int, int]:
    """Two 32-bit keys of a seeded row at generation step ``step`` (any int seed)."""
    s = seed & ((1 << 64) - 1)
    lo, hi = s & _M32, s >> 32
    k = _mix32_int(lo ^ _mix32_int((hi + _GOLDEN) & _M32))
    k1 = _mix32_int(k ^ _mix32_int((step * _GOLDEN + 1) & _M32))
    k2 = _mix32_int((k1 + _GOLDEN) & _M32)
    return k1, k2


def row_keys(params: Sequence[SamplingParams], num_generated: Sequence[int]) -> torch.Tensor:
    """[N, 2] int64 keys on the host: seeded rows from (seed, step), the rest at random."""
    random = torch.randint(0, 1 << 32, (len(params), 2), dtype=torch.int64)
    fixed = [
        row_key(p.seed, n) if p.seed is not None else None
        for p, n in zip(params, num_generated, strict=True)
    ]
    if any(k is not None for k in fixed):
        rows = [i for i, k in enumerate(fixed) if k is not None]
        random[rows] = torch.tensor([fixed[i] for i in rows], dtype=torch.int64)
    return random


def uniforms(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """[N, V] float32 uniforms in (0, 1), a pure function of each row's keys and token index."""
    idx = torch.arange(vocab, device=keys.device, dtype=torch.int64).mul_(_GOLDEN)
    x = _mix32_(idx.bitwise_and_(_M32)[None, :] ^ keys[:, :1])
    x ^= keys[:, 1:]
    return unit_interval(_mix32_(x))


def unit_interval(x: torch.Tensor) -> torch.Tensor:
    """int64 values in [0, 2**32) -> float32 in (0, 1), never 0 or 1: the top 23 bits, centred.
    (With 24 bits the largest value, 2**24 - 0.5, rounds up to 2**24 in float32: u = 1, Gumbel
    noise +inf, and a masked token's -inf + inf = NaN would win the argmax.)"""
    return (x >> 9).float().add_(0.5).mul_(1.0 / (1 << 23))


def gumbel(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """[N, V] standard Gumbel noise: argmax(logits + noise) draws from softmax(logits)."""
    return uniforms(keys, vocab).log_().neg_().log_().neg_()


def _column(values: Sequence[float], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=like.dtype).to(like.device, non_blocking=True)[:, None]


def truncate(x: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Temperature-scaled [N, V] logits -> min-p, top-k and top-p tails set to -inf."""
    neg_inf = float("-inf")
    if any(p.min_p > 0.0 for p in params):
        floor = _column([p.min_p for p in params], x).log()  # log 0 = -inf keeps every token
        x = x.masked_fill(x < x.max(dim=-1, keepdim=True).values + floor, neg_inf)
    vocab = x.shape[-1]
    use_k = any(0 < p.top_k < vocab for p in params)
    use_p = any(p.top_p < 1.0 for p in params)
    if not (use_k or use_p):
        return x
    sorted_x, order = torch.sort(x, dim=-1, descending=True)
    drop = torch.zeros_like(sorted_x, dtype=torch.bool)
    if use_k:
        ks = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
        rank = torch.arange(vocab, device=x.device)[None, :]
        drop |= rank >= torch.tensor(ks).to(x.device, non_blocking=True)[:, None]
        sorted_x = sorted_x.masked_fill(drop, neg_inf)
    if use_p:
        probs = torch.softmax(sorted_x, dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop |= (torch.cumsum(probs, dim=-1) - probs) >= _column([p.top_p for p in params], x)
    return x.masked_fill(torch.zeros_like(drop).scatter_(-1, order, drop), neg_inf)


def process(
    logits: torch.Tensor, params: Sequence[SamplingParams], penalty_entries: np.ndarray
) -> torch.Tensor:
    """Raw [N, V] float32 logits -> penalized, biased logits (before temperature), the bias built
    for this call. ``penalty_entries``: ``PenaltyCounts.entries`` of these rows."""
    bias = logit_bias.one_shot(params, logits.shape[-1], logits.device)
    return _process(logits, params, penalty_entries, bias)


def _process(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    penalty_entries: np.ndarray,
    bias: BiasEntries | None,
) -> torch.Tensor:
    x = apply_penalties(logits, params, penalty_entries)
    return x if bias is None else bias.apply(x)


# On the CPU rows are sampled this many logits at a time: [N, V] temporaries of a large batch
# would each be a fresh mapping of tens of MB, and page faults would dominate. Every operation is
# row-wise, so chunks give the same result; the GPU takes all rows at once.
_CPU_CHUNK = 1 << 19
_NO_ENTRIES = np.zeros((3, 0), dtype=np.int64)


class Sampler:
    """The runner's sampler; carries the penalty records of requests from step to step."""

    def __init__(self) -> None:
        self.penalties = PenaltyCounts()
        self.bias = LogitBiasTable()  # each request's logit bias as tensors, built once

    def __call__(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        num_generated: Sequence[int],
        histories: Sequence[Sequence[int]] | None = None,
        request_ids: Sequence[str] | None = None,
        grammar: PendingMask | None = None,
    ) -> SamplerOutput:
        """Row i of float32 logits [N, V] -> one token with params[i].

        ``histories[i]``: the row's prompt + generated tokens, the request's own append-only
        list (penalties only; its last ``num_generated[i]`` entries are the generated ones).
        ``request_ids[i]`` names the request whose penalty record row i continues.
        ``grammar``: the step's masks of its constrained rows, joined here (after the host-side
        preparation above, as late as possible).
        """
        n, vocab = logits.shape
        if n == 0:
            return SamplerOutput([], None)
        entries = _NO_ENTRIES
        ids = request_ids if request_ids is not None else [str(i) for i in range(n)]
        if needs_penalties(params):
            assert histories is not None, "penalties need the rows' token lists"
            entries = self.penalties.entries(ids, params, histories, num_generated)
        bias = self.bias.entries(ids, params, vocab, logits.device)
        wanted = [p.logprobs for p in params]
        k = None if all(w is None for w in wanted) else max(w or 0 for w in wanted)
        step = n if logits.device.type != "cpu" else max(1, _CPU_CHUNK // vocab)
        mask = grammar.wait() if grammar is not None else None
        packs = [
            _sample_rows(
                logits[r : r + step],
                params[r : r + step],
                num_generated[r : r + step],
                _rows_of(entries, r, r + step),
                None if bias is None else bias.rows_of(r, r + step),
                k,
                None if mask is None else mask.rows_of(r, r + step),
            )
            for r in range(0, n, step)
        ]
        rows = (packs[0] if len(packs) == 1 else torch.cat(packs)).tolist()  # the one host copy
        if k is None:
            return SamplerOutput(rows, None)
        return _unpack(rows, wanted, k)


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    num_generated: Sequence[int],
    histories: Sequence[Sequence[int]] | None = None,
) -> SamplerOutput:
    """One step with no records carried over (penalties counted from the token lists)."""
    return Sampler()(logits, params, num_generated, histories)


def _rows_of(entries: np.ndarray, start: int, stop: int) -> np.ndarray:
    """The entries of batch rows [start, stop), renumbered from 0 (entries are row-major)."""
    if entries.shape[1] == 0:
        return entries
    lo, hi = np.searchsorted(entries[0], [start, stop])
    part = entries[:, lo:hi].copy()
    part[0] -= start
    return part


def _sample_rows(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    num_generated: Sequence[int],
    penalty_entries: np.ndarray,
    bias: BiasEntries | None,
    k: int | None,
    mask: StepMask | None = None,
) -> torch.Tensor:
    """Tokens [N] int64, or with ``k`` not None [N, 2 + 2k] float64 rows
    (token, its logprob, k top token ids, their logprobs)."""
    raw = logits.float() if mask is None else mask.apply(logits.float())
    x = _process(raw, params, penalty_entries, bias)
    tokens = x.argmax(dim=-1)
    if not all(p.greedy for p in params):
        greedy = [p.greedy for p in params]
        temps = _column(
            [1.0 if g else p.temperature for p, g in zip(params, greedy, strict=True)], x
        )
        keys = row_keys(params, num_generated).to(x.device, non_blocking=True)
        noisy = truncate(x / temps, params).add_(gumbel(keys, x.shape[-1]))
        is_greedy = torch.tensor(greedy).to(x.device, non_blocking=True)
        tokens = torch.where(is_greedy, tokens, noisy.argmax(dim=-1))
    if k is None:
        return tokens
    lp = torch.log_softmax(raw, dim=-1)
    parts = [tokens[:, None].double(), lp.gather(-1, tokens[:, None]).double()]
    if k > 0:
        top = torch.topk(lp, k, dim=-1)
        parts += [top.indices.double(), top.values.double()]
    return torch.cat(parts, dim=-1)


def _unpack(rows: list[list[float]], wanted: Sequence[int | None], k: int) -> SamplerOutput:
    tokens = [int(r[0]) for r in rows]
    logprobs: list[TokenLogprob | None] = []
    for r, w in zip(rows, wanted, strict=True):
        if w is None:
            logprobs.append(None)
            continue
        # A grammar may allow fewer than w tokens: the rest are -inf, not alternatives.
        top_pairs = tuple(
            (int(r[2 + j]), r[2 + k + j]) for j in range(w) if r[2 + k + j] != float("-inf")
        )
        logprobs.append(TokenLogprob(int(r[0]), r[1], top_pairs))
    return SamplerOutput(tokens, logprobs)
