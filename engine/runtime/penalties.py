"""Repetition, presence and frequency penalties over a batch of rows, as tensor ops.

Only the logits of tokens a row has seen change, so the work is sparse. Per penalized request the
host keeps a small record (``PenaltyCounts``): its distinct tokens, sorted, and how often each was
generated, extended by the tokens appended since the previous step (usually one), so a step costs
O(new tokens) per row, not O(history). Each step the records of the batch's rows go to the device
in one copy and the device gathers those logits, penalizes them and writes them back into a copy
of the batch's logits. Entries, row-major over rows then token id::

    rows[j], toks[j]   a token row rows[j] has seen (prompt or output with a repetition penalty,
                       output only without one)
    counts[j]          how often the row *generated* it (presence / frequency penalties)

Order: the CTRL / HF repetition penalty first (/r above 0, *r below), then OpenAI's
``logit -= frequency * count + presence * (count > 0)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from engine.params import SamplingParams


def _uses(p: SamplingParams) -> tuple[bool, bool]:
    """(presence/frequency penalty on, repetition penalty on)."""
    return (p.presence_penalty != 0.0 or p.frequency_penalty != 0.0, p.repetition_penalty != 1.0)


def needs_penalties(params: Sequence[SamplingParams]) -> bool:
    return any(any(_uses(p)) for p in params)


class _Row:
    """Distinct tokens of one request (sorted) and their generated counts, up to ``length``."""

    def __init__(self, history: Sequence[int], n_gen: int, freq: bool, rep: bool) -> None:
        self.history = history  # the request's own token list (append-only)
        self.gen_start = len(history) - n_gen  # first generated position (the prompt length)
        self.freq, self.rep = freq, rep
        self.length = len(history)
        generated = np.asarray(history[self.gen_start :], dtype=np.int64)
        self.seen = np.unique(np.asarray(history, dtype=np.int64)) if rep else np.unique(generated)
        self.counts = np.zeros(len(self.seen), dtype=np.int64)
        if freq and len(generated):
            tokens, counts = np.unique(generated, return_counts=True)
            self.counts[np.searchsorted(self.seen, tokens)] = counts

    def follows(self, history: Sequence[int], n_gen: int, freq: bool, rep: bool) -> bool:
        """Is ``history`` this record's list, grown only by appending?"""
        return (
            history is self.history
            and len(history) >= self.length
            and len(history) - n_gen == self.gen_start
            and (freq, rep) == (self.freq, self.rep)
        )

    def extend(self) -> None:
        """Count the tokens appended since the last call (all generated: past the prompt)."""
        for tok in self.history[self.length :]:
            pos = int(np.searchsorted(self.seen, tok))
            if pos == len(self.seen) or self.seen[pos] != tok:
                self.seen = np.insert(self.seen, pos, tok)
                self.counts = np.insert(self.counts, pos, 0)
            if self.freq:
                self.counts[pos] += 1
        self.length = len(self.history)


class PenaltyCounts:
    """Per-request penalty records, carried from step to step by the runner.

    A record lives while its request is sampled: one absent from a step is dropped (and rebuilt
    from its token list if it comes back); one whose token list changed identity (a new request
    under a reused id) or shape is rebuilt.
    """

    def __init__(self) -> None:
        self._rows: dict[str, _Row] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def entries(
        self,
        request_ids: Sequence[str],
        params: Sequence[SamplingParams],
        histories: Sequence[Sequence[int]],
        num_generated: Sequence[int],
    ) -> np.ndarray:
        """[3, K] int64 (batch row, token, generated count) of every token a penalty may
        change; rows without penalties have none."""
        live: dict[str, _Row] = {}
        rows: list[int] = []
        records: list[_Row] = []
        batch = zip(request_ids, params, histories, num_generated, strict=True)
        for i, (rid, p, hist, n) in enumerate(batch):
            freq, rep = _uses(p)
            if not (freq or rep):
                continue
            row = self._rows.get(rid)
            if row is not None and row.follows(hist, n, freq, rep):
                row.extend()
            else:
                row = _Row(hist, n, freq, rep)
            live[rid] = row
            rows.append(i)
            records.append(row)
        self._rows = live
        if not records:
            return np.zeros((3, 0), dtype=np.int64)
        sizes = [len(r.seen) for r in records]
        out = np.empty((3, sum(sizes)), dtype=np.int64)
        out[0] = np.repeat(np.asarray(rows, dtype=np.int64), sizes)
        np.concatenate([r.seen for r in records], out=out[1])
        np.concatenate([r.counts for r in records], out=out[2])
        return out

    def check_integrity(self) -> None:
        """Every record equals one rebuilt from its token list."""
        for rid, row in self._rows.items():
            fresh = _Row(row.history[: row.length], row.length - row.gen_start, row.freq, row.rep)
            assert np.array_equal(fresh.seen, row.seen), f"{rid}: seen tokens drifted"
            assert np.array_equal(fresh.counts, row.counts), f"{rid}: counts drifted"


def apply_penalties(
    logits: torch.Tensor, params: Sequence[SamplingParams], entries: np.ndarray
) -> torch.Tensor:
    """[N, V] float32 logits -> penalized copy (the input is left as it is)."""
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
