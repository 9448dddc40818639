"""The block pool: a free deque of EMPTY blocks and an evictor over idle READY leaves.

    free deque   EMPTY, ref 0 (never keyed, dropped or evicted); taken first, FIFO
    idle         keyed READY, ref 0, unpinned: reclaimable, counted in ``num_idle``
    evictor heap idle blocks without cached children (leaves), ordered by
                 (priority, last_access, stamp); entries go stale lazily and are skipped

An idle block never gains a child (a request registers block i only while it holds block i-1),
so a leaf stays a leaf until it is taken or evicted; evicting a leaf may make its parent a leaf.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

from engine.core.kv.block import Block


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: deque[Block] = deque(self.blocks)
        self.num_idle = 0
        self._heap: list[tuple[int, int, int, Block]] = []
        self._stamp = 0

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_allocatable(self) -> int:
        return len(self.free) + self.num_idle

    def push_free(self, block: Block) -> None:
        self.free.append(block)

    def mark_idle(self, block: Block) -> None:
        """``block`` just lost its last holder or pin."""
        self.num_idle += 1
        if not block.children:
            self.push_leaf(block)

    def unmark_idle(self, block: Block) -> None:
        """``block`` is held or pinned again: no longer reclaimable (its heap entry goes stale)."""
        self.num_idle -= 1
        block.heap_stamp = 0

    def push_leaf(self, block: Block) -> None:
        self._stamp += 1
        block.heap_stamp = self._stamp
        heapq.heappush(self._heap, (block.priority, block.last_access, self._stamp, block))
        if len(self._heap) > 2 * self.num_idle + 1024:
            self._compact()

    def pop_leaf(self) -> Block | None:
        """Remove and return the idle leaf to evict next (the caller unlinks and resets it)."""
        heap = self._heap
        while heap:
            _, _, stamp, block = heapq.heappop(heap)
            if block.heap_stamp == stamp:
                self.num_idle -= 1
                block.heap_stamp = 0
                return block
        return None

    def leaves(self) -> Iterator[Block]:
        """Live heap entries (for integrity checks), in no particular order."""
        return (block for _, _, stamp, block in self._heap if block.heap_stamp == stamp)

    def _compact(self) -> None:
        self._heap = [e for e in self._heap if e[3].heap_stamp == e[2]]
        heapq.heapify(self._heap)
