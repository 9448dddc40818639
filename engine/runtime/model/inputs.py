"""ScheduledBatch -> the tensors of one ragged forward (token ids, positions, AttentionMetadata).

Per request i with new tokens at positions ``start_pos .. end_pos-1``::

    query rows     query_start_loc[i] .. query_start_loc[i+1]-1   (concatenated in batch order)
    slot of pos p  block_table[p // block_size] * block_size + p % block_size
    logits row     query_start_loc[i+1]-1, only when the request samples this step

A batch mixing one-token requests (decode rows) with longer chunks lists the former in
``meta.decode_seqs`` (the GPU path attends them with the split-KV kernel).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from engine.core.batch import ScheduledBatch, ScheduledSeq
from engine.runtime.kernels.metadata import AttentionMetadata


@dataclass(frozen=True)
class StepInputs:
    input_ids: torch.Tensor  # int64 [T]
    positions: torch.Tensor  # int64 [T]
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # int64 [N], N = requests sampling this step
    sampled_seqs: tuple[int, ...]  # batch indices of those requests, same order


def _checked_table(seq: ScheduledSeq, block_size: int, max_len: int) -> list[int]:
    """The blocks of ``seq.block_table`` that cover its tokens, after checking the request (block
    id bounds are checked on the whole padded array, see ``_check_block_ids``)."""
    need = (seq.end_pos + block_size - 1) // block_size
    if not seq.token_ids:
        raise ValueError(f"request {seq.request_id}: no tokens scheduled")
    if seq.end_pos > max_len:
        raise ValueError(f"request {seq.request_id}: {seq.end_pos} tokens exceed {max_len}")
    if len(seq.block_table) < need:
        raise ValueError(
            f"request {seq.request_id}: block table has {len(seq.block_table)} blocks, "
            f"{need} needed for {seq.end_pos} tokens"
        )
    return list(seq.block_table[:need])


def shared_prefix_blocks(tables: Sequence[Sequence[int]], contexts: Sequence[int], bs: int) -> int:
    """Leading block ids equal in every table and inside every request's cached context."""
    limit = min(contexts) // bs
    first = tables[0]
    n = 0
    while n < limit and all(t[n] == first[n] for t in tables):
        n += 1
    return n


def slots_of(table: Sequence[int], start: int, end: int, block_size: int) -> list[int]:
    """Flat cache slots of positions start..end-1: one contiguous range per block touched."""
    slots: list[int] = []
    pos = start
    while pos < end:
        block, off = divmod(pos, block_size)
        n = min(block_size - off, end - pos)
        base = table[block] * block_size + off
        slots.extend(range(base, base + n))
        pos += n
    return slots


def _padded_tables(tables: Sequence[Sequence[int]]) -> torch.Tensor:
    """int32 [len(tables), longest], zero-padded; filled row by row from the lists (C loops)."""
    out = np.zeros((len(tables), max(len(t) for t in tables)), dtype=np.int32)
    for row, table in zip(out, tables, strict=True):
        row[: len(table)] = table
    return torch.from_numpy(out)


def _check_block_ids(padded: torch.Tensor, batch: ScheduledBatch, num_blocks: int) -> None:
    """One vectorized bounds check per step (padding is 0, a valid id); the listing on error."""
    if int(padded.min()) >= 0 and int(padded.max()) < num_blocks:
        return
    for seq, row in zip(batch.seqs, padded.tolist(), strict=True):
        bad = [b for b in row if not 0 <= b < num_blocks]
        if bad:
            ids = f"block ids {bad} outside 0..{num_blocks - 1}"
            raise ValueError(f"request {seq.request_id}: {ids}")


def build_step_inputs(
    batch: ScheduledBatch, block_size: int, num_blocks: int, max_len: int, device: torch.device
) -> StepInputs:
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    starts, contexts, seq_lens, tables = [0], [], [], []
    logits_rows: list[int] = []
    sampled: list[int] = []
    for i, seq in enumerate(batch.seqs):
        table = _checked_table(seq, block_size, max_len)
        ids.extend(seq.token_ids)
        positions.extend(range(seq.start_pos, seq.end_pos))
        slots.extend(slots_of(table, seq.start_pos, seq.end_pos, block_size))
        starts.append(len(ids))
        contexts.append(seq.start_pos)
        seq_lens.append(seq.end_pos)
        tables.append(table)
        if seq.sample:
            logits_rows.append(len(ids) - 1)
            sampled.append(i)
    block_tables = _padded_tables(tables)
    _check_block_ids(block_tables, batch, num_blocks)

    def i32(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    decode_rows = [i for i, seq in enumerate(batch.seqs) if len(seq.token_ids) == 1]
    mixed = 0 < len(decode_rows) < len(batch.seqs)
    meta = AttentionMetadata(
        query_start_loc=i32(starts),
        context_lens=i32(contexts),
        seq_lens=i32(seq_lens),
        block_tables=block_tables.to(device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        max_query_len=max(len(s.token_ids) for s in batch.seqs),
        max_seq_len=max(seq_lens),
        block_size=block_size,
        num_shared_blocks=shared_prefix_blocks(tables, contexts, block_size),
        decode_seqs=i32(decode_rows) if mixed else None,
    )
    return StepInputs(
        input_ids=torch.tensor(ids, dtype=torch.int64, device=device),
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        meta=meta,
        logits_indices=torch.tensor(logits_rows, dtype=torch.int64, device=device),
        sampled_seqs=tuple(sampled),
    )
