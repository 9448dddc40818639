"""CUDA graphs of the decode forward, one per batch-size bucket, replayed on static buffers.

A decode step launches ~11 kernels per layer from Python; a graph replays them all at once.
Graphs read and write fixed addresses, so every step copies its inputs into static buffers sized
for the largest bucket; a bucket of B rows uses their first B rows::

    input_ids, positions, slot_mapping     [Bmax]          padding rows: id 0, position 0, slot -1
    seq_lens [Bmax], context_lens [Bmax]                   padding rows: 1 key (block 0), 0
    block_tables [Bmax, max_blocks]                        only columns < ceil(seq_len / bs) read
    query_start_loc = arange(Bmax + 1), logits_indices = arange(Bmax)   constant

A padding row stores nothing (slot -1) and reads one finite key; its logits are dropped. The
attention plan is fixed at capture: split-KV decode with splits planned for ``max_model_len``
(splits past a request's length are empty). Steps that are not plain decode (prefill chunks,
cascade-worthy shared prefixes, more rows than the largest bucket, fewer sampled rows than
requests) run eagerly.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from engine.runtime.kernels.cascade_rule import use_cascade
from engine.runtime.kernels.metadata import AttentionMetadata
from engine.runtime.model.inputs import StepInputs

Forward = Callable[
    [torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor], torch.Tensor
]  # (input_ids, positions, meta, logits_indices) -> float32 logits [rows, V]


def graph_buckets(max_num_seqs: int) -> tuple[int, ...]:
    """Batch sizes that get a graph: 1, 2, 4, 8, then every 16 up to max_num_seqs (and
    max_num_seqs itself), at most 512."""
    top = min(max_num_seqs, 512)
    sizes = {s for s in (1, 2, 4, 8) if s <= top} | set(range(16, top + 1, 16)) | {top}
    return tuple(sorted(sizes))


def pick_bucket(buckets: Sequence[int], num_seqs: int) -> int | None:
    """The smallest bucket holding ``num_seqs`` rows; None when none does."""
    for size in buckets:
        if size >= num_seqs:
            return size
    return None


def is_graph_step(inputs: StepInputs) -> bool:
    """A plain decode step: one new token per request, each sampled, no cascade (pure)."""
    meta = inputs.meta
    n = meta.num_seqs
    if n == 0 or not meta.is_decode_only or inputs.input_ids.shape[0] != n:
        return False
    if len(inputs.sampled_seqs) != n:
        return False
    cascade = meta.num_shared_blocks and use_cascade(meta.num_shared_blocks, meta.block_size, n, n)
    return not cascade


@dataclass
class StaticInputs:
    """The buffers every graph reads (see the module docstring)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    seq_lens: torch.Tensor
    context_lens: torch.Tensor
    query_start_loc: torch.Tensor
    block_tables: torch.Tensor
    logits_indices: torch.Tensor
    max_model_len: int
    block_size: int

    @classmethod
    def allocate(
        cls, max_rows: int, max_model_len: int, block_size: int, device: torch.device
    ) -> StaticInputs:
        def zeros(*shape: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        rows = torch.arange(max_rows + 1, device=device)
        static = cls(
            input_ids=zeros(max_rows, dtype=torch.int64),
            positions=zeros(max_rows, dtype=torch.int64),
            slot_mapping=zeros(max_rows, dtype=torch.int64),
            seq_lens=zeros(max_rows),
            context_lens=zeros(max_rows),
            query_start_loc=rows.to(torch.int32),
            block_tables=zeros(max_rows, -(-max_model_len // block_size)),
            logits_indices=rows[:max_rows].clone(),
            max_model_len=max_model_len,
            block_size=block_size,
        )
        static.pad(0, max_rows)
        return static

    @property
    def max_rows(self) -> int:
        return int(self.input_ids.shape[0])

    def pad(self, lo: int, hi: int) -> None:
        """Rows lo..hi-1 become inert padding."""
        self.input_ids[lo:hi] = 0
        self.positions[lo:hi] = 0
        self.slot_mapping[lo:hi] = -1
        self.seq_lens[lo:hi] = 1
        self.context_lens[lo:hi] = 0
        self.block_tables[lo:hi, 0] = 0

    def fill(self, inputs: StepInputs, bucket: int) -> None:
        """Copy a decode step of n <= bucket rows in; rows n..bucket-1 padded."""
        meta = inputs.meta
        n, width = meta.num_seqs, int(meta.block_tables.shape[1])
        assert n <= bucket <= self.max_rows and width <= self.block_tables.shape[1]
        self.input_ids[:n].copy_(inputs.input_ids)
        self.positions[:n].copy_(inputs.positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.seq_lens[:n].copy_(meta.seq_lens)
        self.context_lens[:n].copy_(meta.context_lens)
        self.block_tables[:n, :width].copy_(meta.block_tables)
        if n < bucket:
            self.pad(n, bucket)

    def meta(self, bucket: int) -> AttentionMetadata:
        """Metadata over the first ``bucket`` rows (already validated: shapes are fixed)."""
        return AttentionMetadata(
            query_start_loc=self.query_start_loc[: bucket + 1],
            context_lens=self.context_lens[:bucket],
            seq_lens=self.seq_lens[:bucket],
            block_tables=self.block_tables[:bucket],
            slot_mapping=self.slot_mapping[:bucket],
            max_query_len=1,
            max_seq_len=self.max_model_len,
            block_size=self.block_size,
            checked=True,
        )

    def run(self, forward: Forward, bucket: int) -> torch.Tensor:
        """One forward over the first ``bucket`` rows (what a graph records)."""
        return forward(
            self.input_ids[:bucket], self.positions[:bucket], self.meta(bucket),
            self.logits_indices[:bucket],
        )  # fmt: skip


class Replayable(Protocol):
    def replay(self) -> None: ...


Capture = Callable[[Callable[[], torch.Tensor]], tuple[Replayable, torch.Tensor]]


def cuda_capture(device: torch.device) -> Capture:
    """Capture with ``torch.cuda.graph``, every graph sharing one memory pool."""
    pool = torch.cuda.graph_pool_handle()

    def capture(fn: Callable[[], torch.Tensor]) -> tuple[Replayable, torch.Tensor]:
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            fn()  # warm: allocator and lazy initialisation outside the capture
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = fn()
        return graph, out

    return capture


class DecodeGraphs:
    """One captured decode forward per bucket; ``run`` replays the right one or returns None."""

    def __init__(self, forward: Forward, static: StaticInputs, buckets: Sequence[int]) -> None:
        self.forward = forward
        self.static = static
        self.buckets = tuple(sorted(buckets))
        self.graphs: dict[int, tuple[Replayable, torch.Tensor]] = {}
        self.replays = 0

    def capture(self, capture: Capture) -> None:
        """Largest bucket first (the shared pool then fits every smaller graph)."""
        for bucket in sorted(self.buckets, reverse=True):
            self.static.pad(0, bucket)
            self.graphs[bucket] = capture(functools.partial(self.static.run, self.forward, bucket))

    def run(self, inputs: StepInputs) -> torch.Tensor | None:
        """float32 logits [n, V] of a graph step (valid until the next replay), else None."""
        if not self.graphs or not is_graph_step(inputs):
            return None
        bucket = pick_bucket(self.buckets, inputs.meta.num_seqs)
        if bucket is None or inputs.meta.block_tables.shape[1] > self.static.block_tables.shape[1]:
            return None
        self.static.fill(inputs, bucket)
        graph, logits = self.graphs[bucket]
        graph.replay()
        self.replays += 1
        return logits[: inputs.meta.num_seqs]

    def check_integrity(self) -> None:
        assert set(self.graphs) <= set(self.buckets), "a graph outside the buckets"
        assert max(self.buckets, default=0) <= self.static.max_rows, "buckets exceed buffers"
        for bucket, (_, logits) in self.graphs.items():
            assert logits.shape[0] == bucket, f"bucket {bucket}: logits rows {logits.shape[0]}"
