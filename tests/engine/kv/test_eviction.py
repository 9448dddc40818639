"""Retention priorities and eviction order: leaf first, lowest priority, then LRU."""

from __future__ import annotations

import pytest

from engine.core.kv import PriorityRange

from .conftest import make_cache, toks


class Recorder:
    def __init__(self) -> None:
        self.stored: list[tuple[str, bytes, bytes | None, tuple[int, ...]]] = []
        self.removed: list[bytes] = []

    def on_stored(
        self, namespace: str, key: bytes, parent_key: bytes | None, token_ids: tuple[int, ...]
    ) -> None:
        self.stored.append((namespace, key, parent_key, token_ids))

    def on_removed(self, key: bytes) -> None:
        self.removed.append(key)


def cached_chain(cache, rid: str, ns: str, n_blocks: int, bs: int, **kw) -> list[int]:
    """Compute and release a request whose prompt is exactly ``n_blocks`` full blocks."""
    alloc = cache.allocate(rid, ns, toks(n_blocks * bs, base=kw.pop("base", 0)), **kw)
    cache.commit(rid, n_blocks * bs)
    cache.free(rid)
    return list(alloc.block_table)


def evicted_ids(cache, recorder: Recorder, n: int) -> list[int]:
    """Evict ``n`` blocks one at a time and map removed keys back to block ids."""
    key_to_id = {key: bid for bid, key in recorder_keys(cache)}
    out = []
    for _ in range(n):
        assert cache.evict(1) == 1
        out.append(key_to_id[recorder.removed[-1]])
    return out


def recorder_keys(cache) -> list[tuple[int, bytes]]:
    return [(b.block_id, b.key) for b in cache.inner.pool.blocks if b.key is not None]


def test_evicts_leaf_first_and_parent_becomes_leaf(bs: int) -> None:
    rec = Recorder()
    cache = make_cache(8, bs, listener=rec)
    assert cached_chain(cache, "a", "t", 3, bs) == [0, 1, 2]
    assert cached_chain(cache, "b", "u", 1, bs) == [3]  # more recently used
    assert evicted_ids(cache, rec, 4) == [2, 1, 0, 3]
    assert cache.evict(1) == 0
    assert cache.stats().evictions == 4 and cache.stats().blocks_cached == 0


def test_lowest_priority_evicted_first_then_lru(bs: int) -> None:
    rec = Recorder()
    cache = make_cache(8, bs, listener=rec)
    cached_chain(cache, "a", "t", 1, bs, priorities=[PriorityRange(0, None, 90)])  # block 0
    cached_chain(cache, "b", "u", 1, bs)  # block 1, default 35
    cached_chain(cache, "c", "v", 1, bs)  # block 2, default 35, newer
    cached_chain(cache, "d", "w", 1, bs, priorities=[PriorityRange(0, None, 0)])  # block 3
    assert evicted_ids(cache, rec, 4) == [3, 1, 2, 0]


def test_block_takes_max_of_overlapping_ranges(bs: int) -> None:
    cache = make_cache(8, bs)
    ranges = [PriorityRange(0, bs + 1, 90), PriorityRange(bs, None, 10)]
    cache.allocate("a", "t", toks(3 * bs), priorities=ranges)
    blocks = cache.inner.pool.blocks
    assert [blocks[i].priority for i in range(3)] == [90, 90, 10]
    # a sharer with a lower priority keeps the max; a higher one raises it
    cache.allocate("b", "t", toks(3 * bs), priorities=[PriorityRange(0, None, 5)])
    assert blocks[0].priority == 90 and blocks[1].priority == 90
    cache.allocate("c", "t", toks(2 * bs + 1), priorities=[PriorityRange(0, None, 100)])
    assert blocks[0].priority == 100 and blocks[1].priority == 100


def test_decode_tokens_low_priority_evicted_before_system_prompt(bs: int) -> None:
    rec = Recorder()
    cache = make_cache(16, bs, listener=rec)
    ranges = [PriorityRange(0, 2 * bs, 90), PriorityRange(2 * bs, None, 5)]
    prompt = toks(2 * bs + 1)
    cache.allocate("a", "t", prompt, priorities=ranges)
    seq = list(prompt)
    while len(seq) < 4 * bs:
        seq.append(500 + len(seq))
        cache.allocate("a", "t", seq)
    cache.commit("a", len(seq))
    cache.free("a")
    cached_chain(cache, "b", "u", 1, bs)  # default priority, most recent
    assert evicted_ids(cache, rec, 5) == [3, 2, 4, 1, 0]


def test_allocation_takes_free_blocks_then_evicts(bs: int) -> None:
    cache = make_cache(4, bs)
    cached_chain(cache, "a", "t", 3, bs)
    alloc = cache.allocate("b", "u", toks(3 * bs))
    assert alloc.block_table == (3, 2, 1)
    stats = cache.stats()
    assert stats.evictions == 2 and stats.blocks_cached == 1 and stats.blocks_free == 1
    assert cache.lookup("t", toks(3 * bs)).block_ids == (0,)


def test_referenced_pending_and_pinned_blocks_are_never_evicted(bs: int) -> None:
    cache = make_cache(8, bs)
    cached_chain(cache, "p", "t", 2, bs)  # blocks 0, 1
    assert cache.pin("t", toks(2 * bs))
    cache.allocate("a", "u", toks(2 * bs))  # pending 2, 3
    cached_chain(cache, "r", "v", 2, bs)  # blocks 4, 5 idle
    cache.allocate("r2", "v", toks(2 * bs + 1))  # holds 4, 5 again
    assert cache.evict(8) == 0
    assert cache.stats().blocks_free == 1


def test_evict_makes_room_counted_in_free(bs: int) -> None:
    cache = make_cache(6, bs)
    cached_chain(cache, "a", "t", 4, bs)
    assert cache.stats().blocks_free == 6
    assert cache.evict(2) == 2
    stats = cache.stats()
    assert stats.blocks_free == 6 and stats.blocks_cached == 2 and stats.evictions == 2
    assert cache.lookup("t", toks(4 * bs)).block_ids == (0, 1)


def test_listener_events(bs: int) -> None:
    rec = Recorder()
    cache = make_cache(8, bs, listener=rec)
    cache.allocate("a", "t", toks(2 * bs))
    cache.commit("a", bs)
    assert len(rec.stored) == 1
    ns, key0, parent, tokens = rec.stored[0]
    assert (ns, parent, tokens) == ("t", None, tuple(range(bs)))
    cache.commit("a", 2 * bs)
    assert rec.stored[1][2] == key0 and rec.stored[1][3] == tuple(range(bs, 2 * bs))
    cache.allocate("b", "u", toks(bs + 1))
    cache.free("b")  # uncomputed: dropped, never stored, never removed
    cache.free("a")
    assert len(rec.stored) == 2 and rec.removed == []
    cache.evict(2)
    assert rec.removed == [rec.stored[1][1], key0]


def test_priority_range_validation() -> None:
    cache = make_cache(4, 2)
    with pytest.raises(ValueError):
        cache.allocate("a", "t", toks(3), priorities=[PriorityRange(0, None, 101)])
    with pytest.raises(ValueError):
        cache.allocate("a", "t", toks(3), priorities=[PriorityRange(4, 2, 50)])
    with pytest.raises(ValueError):
        make_cache(4, 2, default_priority=-1)


def test_leaf_first_overrides_priority(bs: int) -> None:
    rec = Recorder()
    cache = make_cache(8, bs, listener=rec)
    ranges = [PriorityRange(0, bs, 10), PriorityRange(bs, None, 90)]
    cached_chain(cache, "a", "t", 2, bs, priorities=ranges)  # blocks 0 (10) <- 1 (90)
    cached_chain(cache, "b", "u", 1, bs, priorities=[PriorityRange(0, None, 50)])  # block 2
    # block 0 has the lowest priority but a cached child: it waits for block 1
    assert evicted_ids(cache, rec, 3) == [2, 1, 0]
