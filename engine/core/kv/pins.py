"""Pinned prefixes: blocks kept resident until unpinned, capped at a share of the pool.

Pins key their prefix without a cache scope: they cover a namespace's shared part (the tenant
prompt), whose keys every scope shares (engine/core/kv/hashing.py).

A block's ``pin_count`` counts the live handles covering it; ``num_pinned`` counts blocks with
``pin_count > 0`` (a block pinned twice counts once against the cap).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.core.kv.block import Block, BlockState
from engine.core.kv.index import KeyIndex, NullIndex
from engine.core.kv.pool import BlockPool
from engine.core.kv.types import PinFailure, PinHandle


def resolve_pin(
    index: KeyIndex | NullIndex, namespace: str, token_ids: Sequence[int], block_size: int
) -> list[Block] | PinFailure:
    """The READY blocks of all full blocks of ``token_ids``, or why they cannot be pinned."""
    num_full = len(token_ids) // block_size
    if num_full == 0:
        return PinFailure(f"prefix has no full block (block size {block_size})")
    root = index.root(namespace)
    if root is None:
        return PinFailure("prefix reuse is disabled", num_full)
    blocks = index.match(index.keys(root, token_ids, block_size, 0, num_full))
    if len(blocks) < num_full:
        pos = len(blocks)
        return PinFailure(f"block {pos} (tokens from {pos * block_size}) is not cached", num_full)
    for block in blocks:
        if block.state is not BlockState.READY:
            return PinFailure(f"block {block.pos} is still being computed (PENDING)", num_full)
    return blocks


class PinTable:
    def __init__(self, cap_blocks: int) -> None:
        self.cap_blocks = cap_blocks
        self.num_pinned = 0
        self.handles: dict[int, tuple[Block, ...]] = {}
        self._next_id = 0

    def new_id(self) -> int:
        """A pin id (shared with host pins, so ``unpin`` finds a handle by id alone)."""
        self._next_id += 1
        return self._next_id

    def pin(
        self, namespace: str, blocks: list[Block], num_tokens: int, pool: BlockPool
    ) -> PinHandle | PinFailure:
        num_new = sum(1 for b in blocks if b.pin_count == 0)
        if self.num_pinned + num_new > self.cap_blocks:
            return PinFailure(
                f"pin cap reached: {self.num_pinned} blocks pinned + {num_new} new "
                f"> cap {self.cap_blocks}",
                num_blocks=len(blocks),
                num_new_blocks=num_new,
                pinned_blocks=self.num_pinned,
                cap_blocks=self.cap_blocks,
            )
        for block in blocks:
            if block.pin_count == 0:
                self.num_pinned += 1
                if block.ref_count == 0:
                    pool.unmark_idle(block)
            block.pin_count += 1
        pin_id = self.new_id()
        self.handles[pin_id] = tuple(blocks)
        ids = tuple(b.block_id for b in blocks)
        return PinHandle(pin_id, namespace, ids, num_tokens)

    def unpin(self, handle: PinHandle, pool: BlockPool, tick: int) -> None:
        blocks = self.handles.pop(handle.pin_id, None)
        if blocks is None:
            return
        for block in blocks:
            block.pin_count -= 1
            if block.pin_count == 0:
                self.num_pinned -= 1
                if block.ref_count == 0:
                    block.last_access = tick
                    pool.mark_idle(block)
