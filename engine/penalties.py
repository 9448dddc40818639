"""Repetition, presence and frequency penalties over a batch of rows, as tensor ops.

Only the logits of tokens a row has seen change, so the work is sparse: the host lists each
penalized row's distinct tokens with their generated counts (numpy over the rows' token lists),
sends them in one copy, and the device gathers those logits, penalizes them and writes them back
into a copy of the batch's logits. Per entry (row-major over rows, then token id)::

    rows[j], toks[j]   a token row rows[j] has seen (prompt or output with a repetition penalty,
                       output only without one)
    counts[j]          how often the row *generated* it (presence / frequency penalties)

Order: the CTRL / HF repetition penalty first (/r above 0, *r below), then OpenAI's
``logit -= frequency * count + presence * (count > 0)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from engine.params import SamplingParams


def _uses(p: SamplingParams) -> tuple[bool, bool]:
    """(presence/frequency penalty on, repetition penalty on)."""
    return (p.presence_penalty != 0.0 or p.frequency_penalty != 0.0, p.repetition_penalty != 1.0)


def needs_penalties(params: Sequence[SamplingParams]) -> bool:
    return any(any(_uses(p)) for p in params)


def _row_entries(hist: Sequence[int], n_gen: int, freq: bool, rep: bool) -> tuple[Any, Any]:
    """Distinct tokens of one row and how often each was generated."""
    generated = np.asarray(hist[len(hist) - n_gen :] if n_gen else (), dtype=np.int64)
    seen = np.unique(np.asarray(hist, dtype=np.int64)) if rep else np.unique(generated)
    counts = np.zeros(len(seen), dtype=np.int64)
    if freq and len(generated):
        gen_tokens, gen_counts = np.unique(generated, return_counts=True)
        counts[np.searchsorted(seen, gen_tokens)] = gen_counts
    return seen, counts


def touched(
    params: Sequence[SamplingParams],
    histories: Sequence[Sequence[int]],
    num_generated: Sequence[int],
) -> np.ndarray:
    """[3, K] int64: (row, token, generated count) of every token a penalty may change."""
    parts: list[np.ndarray] = []
    for i, (p, hist, n) in enumerate(zip(params, histories, num_generated, strict=True)):
        freq, rep = _uses(p)
        if not (freq or rep):
            continue
        seen, counts = _row_entries(hist, n, freq, rep)
        parts.append(np.stack([np.full(len(seen), i, dtype=np.int64), seen, counts]))
    if not parts:
        return np.zeros((3, 0), dtype=np.int64)
    return np.concatenate(parts, axis=1)


def apply_penalties(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    histories: Sequence[Sequence[int]],
    num_generated: Sequence[int],
) -> torch.Tensor:
    """[N, V] float32 logits -> penalized copy (the input is left as it is)."""
    entries = touched(params, histories, num_generated)
    if entries.shape[1] == 0:
        return logits
    dev = logits.device
    idx = torch.from_numpy(entries).to(dev, non_blocking=True)
    rows, toks = idx[0], idx[1]
    counts = idx[2].to(logits.dtype)
    coef = torch.tensor(
        [[p.presence_penalty, p.frequency_penalty, p.repetition_penalty] for p in params],
        dtype=logits.dtype,
    ).to(dev, non_blocking=True)[rows]
    v = logits[rows, toks]
    rep = coef[:, 2]
    v = torch.where(v > 0, v / rep, v * rep)
    v = v - coef[:, 1] * counts - coef[:, 0] * (counts > 0).to(logits.dtype)
    return logits.index_put((rows, toks), v)
