"""One KV block of the pool and its life cycle.

States of a block (``key`` is its content key, ``ref_count`` counts requests holding it)::

    EMPTY    key None: in the free deque (ref 0) or private to one request (ref 1)
    PENDING  keyed, being computed by ``owner``; ref >= 1 (the owner always holds it)
    READY    keyed, K/V written; shared by ``ref_count`` requests, or idle (ref 0) and
             reclaimable unless pinned
    LOADING  keyed, K/V being copied in from the host tier (engine/core/kv/host_tier.py); read only
             after the copy completes; never reclaimed before that, even with ref 0

A keyed block's ``pos`` is its index in every block table that holds it (the key hashes the
whole chain up to it), and ``parent`` is the keyed block at ``pos - 1`` (None at the root).
"""

from __future__ import annotations

from enum import Enum


class BlockState(Enum):
    EMPTY = "empty"
    PENDING = "pending"
    READY = "ready"
    LOADING = "loading"


class Block:
    __slots__ = (
        "block_id",
        "children",
        "heap_stamp",
        "key",
        "last_access",
        "owner",
        "parent",
        "pin_count",
        "pos",
        "priority",
        "ref_count",
        "state",
    )

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.key: bytes | None = None
        self.state = BlockState.EMPTY
        self.ref_count = 0
        self.pin_count = 0
        self.owner: str | None = None  # request computing a PENDING block
        self.parent: Block | None = None
        self.children: set[Block] = set()  # keyed blocks whose parent is this one
        self.pos = -1
        self.priority = 0
        self.last_access = 0
        self.heap_stamp = 0  # matches the live evictor heap entry; 0 = not in the heap

    @property
    def is_idle(self) -> bool:
        """READY, held by no request and no pin: reclaimable."""
        return (
            self.key is not None
            and self.ref_count == 0
            and self.pin_count == 0
            and self.state is BlockState.READY
        )

    def reset(self) -> None:
        """Back to EMPTY (after eviction or drop); links must already be cut by the caller."""
        self.key = None
        self.state = BlockState.EMPTY
        self.owner = None
        self.parent = None
        self.pos = -1
        self.priority = 0
        self.heap_stamp = 0

    def __repr__(self) -> str:
        key = self.key.hex()[:8] if self.key else None
        return (
            f"Block({self.block_id}, {self.state.value}, key={key}, ref={self.ref_count}, "
            f"pin={self.pin_count}, owner={self.owner}, pos={self.pos})"
        )
