"""``check_integrity`` for PrefixCache: recomputes every counter and link from scratch.

The checks read the cache through ``CacheParts``, the parts it owns (the cache passes itself),
so this module needs nothing of ``engine/core/kv/prefix_cache.py``; the host tier checks itself
(``Tiering.check_integrity``) against the device pool and the requests.
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol

from engine.core.kv.block import BlockState
from engine.core.kv.hashing import block_keys, root_key
from engine.core.kv.index import KeyIndex, NullIndex
from engine.core.kv.pins import PinTable
from engine.core.kv.pool import BlockPool
from engine.core.kv.request import RequestState
from engine.core.kv.tiering import Tiering
from engine.core.kv.types import CacheStats


class CacheParts(Protocol):
    """What the checks read: the parts a ``PrefixCache`` owns, and its reported stats."""

    @property
    def block_size(self) -> int: ...
    @property
    def pool(self) -> BlockPool: ...
    @property
    def index(self) -> KeyIndex | NullIndex: ...
    @property
    def pins(self) -> PinTable: ...
    @property
    def requests(self) -> dict[str, RequestState]: ...
    @property
    def tiers(self) -> Tiering: ...
    def stats(self) -> CacheStats: ...


def check_integrity(cache: CacheParts) -> None:
    """Raise AssertionError naming the first broken invariant."""
    holders = _check_requests(cache)
    _check_blocks(cache, holders)
    _check_index(cache)
    _check_pool(cache)
    _check_pins(cache)
    cache.tiers.check_integrity(cache.pool.blocks, cache.requests.values())


def _check_requests(cache: CacheParts) -> Counter[int]:
    bs = cache.block_size
    holders: Counter[int] = Counter()
    for rid, seq in cache.requests.items():
        assert seq.request_id == rid, f"request map entry {rid!r} holds {seq.request_id!r}"
        need = -(-len(seq.tokens) // bs)
        assert len(seq.blocks) == need, (
            f"request {rid!r}: {len(seq.blocks)} blocks for {len(seq.tokens)} tokens (need {need})"
        )
        assert seq.block_ids == [b.block_id for b in seq.blocks], f"{rid!r}: block_ids stale"
        assert len(set(seq.block_ids)) == len(seq.block_ids), f"{rid!r}: block held twice"
        assert len(seq.keys) == len(seq.tokens) // bs, f"{rid!r}: {len(seq.keys)} keys"
        _check_keys(cache, seq)
        for pos, block in enumerate(seq.blocks):
            holders[block.block_id] += 1
            if block.key is not None:
                assert block.pos == pos, f"{rid!r} holds {block!r} at position {pos}"
                assert block.key == seq.keys[pos], f"{rid!r}: key mismatch at position {pos}"
                assert pos == 0 or seq.blocks[pos - 1] is block.parent, (
                    f"{rid!r}: {block!r} held without its parent at position {pos - 1}"
                )
            if block.state is BlockState.PENDING and block.owner != rid:
                assert block.owner in seq.owners, f"{rid!r}: owner {block.owner!r} not tracked"
                assert rid in cache.requests[block.owner].dependents, (
                    f"{rid!r} attached to {block!r} but is not a dependent of its owner"
                )
        for pos in seq.owned[seq.owned_pos :]:
            assert 0 <= pos < len(seq.blocks), f"{rid!r}: owned position {pos} out of range"
    return holders


def _check_keys(cache: CacheParts, seq: RequestState) -> None:
    """The keys kept incrementally are the key rule applied from scratch: the namespace root,
    shared blocks unscoped, every block from the scope's first private one re-rooted."""
    if isinstance(cache.index, NullIndex):
        assert all(k is None for k in seq.keys), f"{seq.request_id!r}: keys without reuse"
        return
    n = len(seq.keys)
    want = block_keys(root_key(seq.namespace), seq.tokens, cache.block_size, 0, n, seq.scope)
    for pos, (key, expected) in enumerate(zip(seq.keys, want, strict=True)):
        assert key == expected, f"{seq.request_id!r}: key of block {pos} breaks the key rule"


def _check_blocks(cache: CacheParts, holders: Counter[int]) -> None:
    bs = cache.block_size
    in_use = pending = idle = 0
    for block in cache.pool.blocks:
        bid = block.block_id
        assert block.ref_count == holders[bid], (
            f"{block!r}: ref_count {block.ref_count} != {holders[bid]} holders"
        )
        in_use += block.ref_count > 0
        if block.key is None:
            assert block.state is BlockState.EMPTY, f"unkeyed {block!r} is not EMPTY"
            assert block.pin_count == 0 and not block.children, f"unkeyed {block!r} has links"
            assert block.owner is None and block.parent is None, f"unkeyed {block!r} has links"
            continue
        assert block.state is not BlockState.EMPTY, f"keyed {block!r} is EMPTY"
        if block.state is BlockState.LOADING:
            pass  # Tiering.check_integrity checks it
        elif block.state is BlockState.PENDING:
            pending += 1
            owner = cache.requests.get(block.owner) if block.owner is not None else None
            assert owner is not None, f"{block!r}: owner is not a live request"
            assert owner.holds(block), f"{block!r}: owner does not hold it"
            assert block.pin_count == 0, f"PENDING {block!r} is pinned"
        else:
            assert block.owner is None, f"READY {block!r} has an owner"
            parent = block.parent
            assert parent is None or parent.state is BlockState.READY, (
                f"READY {block!r} has a PENDING parent {parent!r}"
            )
        if block.is_idle:
            idle += 1
            assert block.state is BlockState.READY, f"idle {block!r} is not READY"
        for child in block.children:
            assert child.parent is block, f"{child!r} listed as child of {block!r}"
            assert child.pos == block.pos + 1, f"{child!r} position vs parent {block!r}"
        if block.parent is not None:
            assert block in block.parent.children, f"{block!r} missing from parent's children"
        else:
            assert block.pos == 0, f"root-level {block!r} not at position 0"
        assert block.pos * bs >= 0, f"{block!r} has no position"
    stats = cache.stats()
    assert stats.blocks_in_use == in_use, f"in_use {stats.blocks_in_use} != {in_use}"
    assert stats.blocks_pending == pending, f"pending {stats.blocks_pending} != {pending}"
    assert cache.pool.num_idle == idle, f"idle count {cache.pool.num_idle} != {idle}"


def _check_index(cache: CacheParts) -> None:
    count = 0
    for key, block in cache.index.items():
        count += 1
        assert block.key == key, f"index key {key.hex()} maps to {block!r}"
    keyed = sum(1 for b in cache.pool.blocks if b.key is not None)
    assert keyed == count, f"{keyed} keyed blocks but {count} index entries"


def _check_pool(cache: CacheParts) -> None:
    pool = cache.pool
    free_ids = [b.block_id for b in pool.free]
    assert len(set(free_ids)) == len(free_ids), "a block is twice in the free deque"
    for block in pool.free:
        assert block.key is None and block.ref_count == 0, f"free deque holds {block!r}"
    empty_unheld = sum(1 for b in pool.blocks if b.key is None and b.ref_count == 0)
    assert empty_unheld == len(free_ids), (
        f"{empty_unheld} unheld EMPTY blocks but {len(free_ids)} in the free deque"
    )
    live = list(pool.leaves())
    assert len({b.block_id for b in live}) == len(live), "a block has two live heap entries"
    for block in live:
        assert block.is_idle and not block.children, f"evictor heap holds non-leaf {block!r}"
    leaves = sum(1 for b in pool.blocks if b.is_idle and not b.children)
    assert leaves == len(live), f"{leaves} idle leaves but {len(live)} in the evictor heap"


def _check_pins(cache: CacheParts) -> None:
    counts: Counter[int] = Counter()
    for blocks in cache.pins.handles.values():
        for block in blocks:
            counts[block.block_id] += 1
    for block in cache.pool.blocks:
        assert block.pin_count == counts[block.block_id], (
            f"{block!r}: pin_count != {counts[block.block_id]} handles"
        )
        if block.pin_count:
            assert block.state is BlockState.READY, f"pinned {block!r} is not READY"
    pinned = sum(1 for c in counts.values() if c)
    assert cache.pins.num_pinned == pinned, f"num_pinned {cache.pins.num_pinned} != {pinned}"
    assert pinned <= cache.pins.cap_blocks, f"{pinned} pinned blocks > cap {cache.pins.cap_blocks}"
