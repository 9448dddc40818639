"""HostKVPool: the host-memory copy of evicted KV blocks, and the copies of a transfer plan.

Layouts (one tensor each)::

    device, per layer l:  k, v = [num_blocks, block_size, kv_heads, head_dim]  (runtime/model)
    host:                 [host_blocks, layers, 2 (k, v), block_size, kv_heads, head_dim]

Host slots are block-major: one block of every layer is one contiguous piece (a single copy per
block each way, and snapshots read a block in one piece). On CUDA the host tensor is page-locked
and the copies run on a side stream: the side stream waits for the compute stream (an offloaded
block is read after the step that wrote it), the compute stream waits for the side stream before
the next forward (a restored block is read after its copy). On the CPU the copies are plain
index copies. Transfers run in plan order (engine/core/kv/transfers.py): a slot reused within one
plan is read before it is overwritten.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import torch

from engine.core.kv.transfers import Direction, Transfer, TransferPlan

KVCache = tuple[torch.Tensor, torch.Tensor]


class HostKVPool:
    def __init__(self, kv_caches: Sequence[KVCache], num_blocks: int) -> None:
        k0 = kv_caches[0][0]
        self.device = k0.device
        self.num_blocks = num_blocks
        self.num_layers = len(kv_caches)
        self.block_shape = tuple(k0.shape[1:])  # block_size, kv_heads, head_dim
        on_cuda = self.device.type == "cuda"
        shape = (num_blocks, self.num_layers, 2, *self.block_shape)
        self.data = torch.zeros(shape, dtype=k0.dtype, pin_memory=on_cuda)
        self.stream = torch.cuda.Stream(self.device) if on_cuda else None

    @property
    def block_bytes(self) -> int:
        return self.data[0].numel() * self.data.element_size()

    def run(self, kv_caches: Sequence[KVCache], plan: TransferPlan) -> int:
        """Perform ``plan`` in order; microseconds of host time spent (enqueueing on CUDA)."""
        start = time.perf_counter()
        stream = self.stream
        if stream is None:
            for direction, group in _runs(plan.transfers):
                self._copy_cpu(kv_caches, direction, group)
        else:
            compute = torch.cuda.current_stream(self.device)
            stream.wait_stream(compute)  # offloads read what earlier steps wrote
            with torch.cuda.stream(stream):
                self.run_staged(kv_caches, plan)
            compute.wait_stream(stream)  # the next forward reads what was restored
        return int((time.perf_counter() - start) * 1e6)

    def sync(self) -> None:
        """Wait until every copy issued so far is done (before reading ``data`` on the host)."""
        if self.stream is not None:
            self.stream.synchronize()

    # ------------------------------------------------------------------ CPU

    def _copy_cpu(
        self, kv_caches: Sequence[KVCache], direction: Direction, group: list[Transfer]
    ) -> None:
        if direction is Direction.OUT:
            group = _last_per_slot(group)
        blocks = torch.tensor([t.block_id for t in group], dtype=torch.long)
        slots = torch.tensor([t.slot for t in group], dtype=torch.long)
        for layer, kv in enumerate(kv_caches):
            for i, cache in enumerate(kv):
                if direction is Direction.OUT:
                    self.data[:, layer, i].index_copy_(0, slots, cache.index_select(0, blocks))
                else:
                    cache.index_copy_(0, blocks, self.data[:, layer, i].index_select(0, slots))

    # ------------------------------------------------------------------ CUDA (staged)

    def run_staged(self, kv_caches: Sequence[KVCache], plan: TransferPlan) -> None:
        """The CUDA copies (one host copy per block through a device staging tensor), issued on
        the current stream; device-agnostic, so the CPU tests check its layout too."""
        for direction, group in _runs(plan.transfers):
            if direction is Direction.OUT:
                self._out_staged(kv_caches, _last_per_slot(group))
            else:
                self._in_staged(kv_caches, group)

    def _out_staged(self, kv_caches: Sequence[KVCache], group: list[Transfer]) -> None:
        blocks = torch.tensor([t.block_id for t in group], dtype=torch.long, device=self.device)
        # [n, layers, 2, block...]: one contiguous device piece per block, one copy each
        staged = torch.stack(
            [
                torch.stack([k.index_select(0, blocks), v.index_select(0, blocks)], 1)
                for k, v in kv_caches
            ],
            1,
        )
        for j, t in enumerate(group):
            self.data[t.slot].copy_(staged[j], non_blocking=True)

    def _in_staged(self, kv_caches: Sequence[KVCache], group: list[Transfer]) -> None:
        staged = torch.empty(
            (len(group), *self.data.shape[1:]), dtype=self.data.dtype, device=self.device
        )
        for j, t in enumerate(group):
            staged[j].copy_(self.data[t.slot], non_blocking=True)
        blocks = torch.tensor([t.block_id for t in group], dtype=torch.long, device=self.device)
        for layer, (k, v) in enumerate(kv_caches):
            k.index_copy_(0, blocks, staged[:, layer, 0])
            v.index_copy_(0, blocks, staged[:, layer, 1])


def _runs(transfers: Sequence[Transfer]) -> Iterator[tuple[Direction, list[Transfer]]]:
    """Maximal runs of one direction, in plan order (order between runs is what matters)."""
    group: list[Transfer] = []
    for t in transfers:
        if group and t.direction is not group[0].direction:
            yield group[0].direction, group
            group = []
        group.append(t)
    if group:
        yield group[0].direction, group


def _last_per_slot(group: list[Transfer]) -> list[Transfer]:
    """A slot written twice in one run keeps the later block (the earlier entry was reclaimed)."""
    last = {t.slot: t for t in group}
    return list(last.values())


def read_blocks(kv_caches: Sequence[KVCache], block_ids: Sequence[int]) -> torch.Tensor:
    """K/V of device blocks as one host tensor [n, layers, 2, block_size, kv_heads, head_dim]."""
    ids = torch.tensor(list(block_ids), dtype=torch.long, device=kv_caches[0][0].device)
    per_layer = [
        torch.stack([k.index_select(0, ids), v.index_select(0, ids)], 1) for k, v in kv_caches
    ]
    return torch.stack(per_layer, 1).cpu()


def write_blocks(
    kv_caches: Sequence[KVCache], block_ids: Sequence[int], data: torch.Tensor
) -> None:
    """Inverse of :func:`read_blocks`: ``data[j]`` into device block ``block_ids[j]``."""
    device = kv_caches[0][0].device
    ids = torch.tensor(list(block_ids), dtype=torch.long, device=device)
    data = data.to(device)
    for layer, (k, v) in enumerate(kv_caches):
        k.index_copy_(0, ids, data[:, layer, 0])
        v.index_copy_(0, ids, data[:, layer, 1])
