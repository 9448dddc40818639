"""Logit bias as tensors built once per request, added to a step's logits in one ``index_add_``.

A request's ``SamplingParams.logit_bias`` ((token id, bias) pairs) becomes two device tensors the
first time the request is sampled (``_Bias``); requests whose params carry the very same tuple
(the ``n`` choices of one chat request) share one. A step concatenates the records of the batch's
biased rows into ``BiasEntries``, row-major, each row's pairs in its request's order, with flat
indices into the [N, V] logits::

    flat[j] = row * V + token,  values[j]      logits.view(-1)[flat[j]] += values[j]

and adds them with one ``index_add_``, which on the CPU adds in index order on one thread: a token
listed twice gets both biases, in the order listed, and the result has the same bits whatever
the thread count (``index_put(accumulate=True)`` splits large index lists across threads, whose
additions to a repeated token then land in any order). The concatenation is kept while the
batch's biased rows stay the same requests in the same places (steady decode), so such a step
costs one scatter over its entries, and no Python code runs per entry after a request's first
step.

A record lives while its request is sampled, like the penalty records: one absent from a step is
dropped and rebuilt if the request comes back (after a preemption); a request id whose params now
carry another tuple (a new request under a reused id) gets a new record.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.params import SamplingParams


class _Bias:
    """One request's bias: token ids [E] int64 and values [E] float32 on the sampling device."""

    __slots__ = ("size", "source", "tokens", "values")

    def __init__(self, source: tuple[tuple[int, float], ...], device: torch.device) -> None:
        self.source = source  # kept: its identity marks the requests this record serves
        self.size = len(source)
        tokens = torch.tensor([t for t, _ in source], dtype=torch.int64)
        values = torch.tensor([b for _, b in source], dtype=torch.float32)
        self.tokens = tokens.to(device, non_blocking=True)
        self.values = values.to(device, non_blocking=True)


@dataclass(frozen=True)
class BiasEntries:
    """The bias of a block of batch rows of a ``vocab``-wide logits tensor. ``row_ids``
    (ascending) are the rows with a bias, ``ends[i]`` the end of row ``row_ids[i]``'s entries."""

    flat: torch.Tensor  # int64 [E]: row * vocab + token
    values: torch.Tensor  # float32 [E]
    vocab: int
    row_ids: tuple[int, ...]
    ends: tuple[int, ...]

    def rows_of(self, start: int, stop: int) -> BiasEntries | None:
        """The entries of batch rows [start, stop), renumbered from 0; None if none is biased."""
        first = bisect.bisect_left(self.row_ids, start)
        last = bisect.bisect_left(self.row_ids, stop)
        if first == last:
            return None
        if start == 0 and last == len(self.row_ids):
            return self
        lo = self.ends[first - 1] if first else 0
        hi = self.ends[last - 1]
        return BiasEntries(
            self.flat[lo:hi] - start * self.vocab,
            self.values[lo:hi],
            self.vocab,
            tuple(r - start for r in self.row_ids[first:last]),
            tuple(e - lo for e in self.ends[first:last]),
        )

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """A biased copy of [N, vocab] ``logits`` (the input is left as it is)."""
        assert logits.shape[-1] == self.vocab and logits.shape[0] > self.row_ids[-1]
        out = logits.clone(memory_format=torch.contiguous_format)
        out.view(-1).index_add_(0, self.flat, self.values.to(out.dtype))
        return out


class LogitBiasTable:
    """Per-request bias records, carried by the sampler from step to step."""

    def __init__(self) -> None:
        self._records: dict[str, _Bias] = {}
        self._last: tuple[tuple[object, ...], BiasEntries] | None = None  # (layout, entries)
        self.builds = 0  # records built so far (a statistic: once per biased request)

    def __len__(self) -> int:
        return len(self._records)

    def entries(
        self,
        request_ids: Sequence[str],
        params: Sequence[SamplingParams],
        vocab: int,
        device: torch.device,
    ) -> BiasEntries | None:
        """The step's bias for rows ``params`` of requests ``request_ids``; None if no row has
        one. Records of requests not in this step are dropped."""
        # live records by their tuple's id: valid while the record keeps that tuple alive
        shared = {id(r.source): r for r in self._records.values()}
        live: dict[str, _Bias] = {}
        row_ids: list[int] = []
        records: list[_Bias] = []
        for i, (rid, p) in enumerate(zip(request_ids, params, strict=True)):
            if not p.logit_bias:
                continue
            record = self._records.get(rid)
            if not _serves(record, p, device):
                record = shared.get(id(p.logit_bias))  # another request with this very tuple
            if record is None or not _serves(record, p, device):
                record = _Bias(p.logit_bias, device)
                self.builds += 1
                shared[id(p.logit_bias)] = record
            live[rid] = record
            row_ids.append(i)
            records.append(record)
        self._records = live
        if not records:
            self._last = None
            return None
        # The same records at the same rows give the same entries (records never change). The
        # layout holds the records themselves (compared by identity), so none is freed and its
        # address reused by another while the layout is kept.
        layout = (vocab, tuple(row_ids), tuple(records))
        if self._last is None or self._last[0] != layout:
            self._last = layout, _concatenate(row_ids, records, vocab, device)
        return self._last[1]


def _serves(record: _Bias | None, p: SamplingParams, device: torch.device) -> bool:
    return record is not None and record.source is p.logit_bias and record.tokens.device == device


def _concatenate(
    row_ids: list[int], records: list[_Bias], vocab: int, device: torch.device
) -> BiasEntries:
    sizes = [r.size for r in records]
    ends = tuple(itertools.accumulate(sizes))
    if len(records) == 1:
        tokens, values = records[0].tokens, records[0].values
    else:
        tokens = torch.cat([r.tokens for r in records])
        values = torch.cat([r.values for r in records])
    rows = torch.repeat_interleave(
        torch.tensor(row_ids, dtype=torch.int64).to(device, non_blocking=True),
        torch.tensor(sizes, dtype=torch.int64).to(device, non_blocking=True),
        output_size=ends[-1],  # known on the host: no device sync for the size
    )
    return BiasEntries(rows.mul_(vocab).add_(tokens), values, vocab, tuple(row_ids), ends)


def one_shot(
    params: Sequence[SamplingParams], vocab: int, device: torch.device
) -> BiasEntries | None:
    """The bias of a batch sampled once (no records carried over)."""
    return LogitBiasTable().entries([str(i) for i in range(len(params))], params, vocab, device)
