"""Pins: resident until unpinned, READY only, capped (a block pinned twice counts once)."""

from __future__ import annotations

from engine.core.kv import PinFailure, PinHandle

from .conftest import make_cache, toks


def cached(cache, rid: str, ns: str, tokens: list[int]) -> None:
    cache.allocate(rid, ns, tokens)
    cache.commit(rid, len(tokens))
    cache.free(rid)


def test_pin_keeps_blocks_resident_until_unpin(bs: int) -> None:
    cache = make_cache(8, bs)
    cached(cache, "a", "t", toks(3 * bs))
    handle = cache.pin("t", toks(2 * bs + bs // 2))
    assert isinstance(handle, PinHandle)
    assert handle.block_ids == (0, 1) and handle.num_tokens == 2 * bs
    assert cache.stats().blocks_pinned == 2 and cache.stats().blocks_free == 6
    assert cache.evict(8) == 1  # only the unpinned leaf (block 2)
    assert cache.lookup("t", toks(2 * bs + 1)).block_ids == (0, 1)
    # pinned blocks are shared with requests and stay pinned after they leave
    alloc = cache.allocate("b", "t", toks(3 * bs))
    assert alloc.block_table == (0, 1, 3)
    cache.commit("b", 3 * bs)
    cache.free("b")
    assert cache.evict(8) == 1  # b's last block only
    cache.unpin(handle)
    cache.unpin(handle)  # idempotent
    assert cache.stats().blocks_pinned == 0
    assert cache.evict(8) == 2


def test_pin_requires_cached_ready_full_blocks(bs: int) -> None:
    cache = make_cache(8, bs)
    failure = cache.pin("t", toks(2 * bs))
    assert isinstance(failure, PinFailure) and "not cached" in failure.reason
    cache.allocate("a", "t", toks(2 * bs + 1))
    failure = cache.pin("t", toks(2 * bs))
    assert isinstance(failure, PinFailure) and "PENDING" in failure.reason
    cache.commit("a", bs)
    failure = cache.pin("t", toks(2 * bs))
    assert isinstance(failure, PinFailure) and "PENDING" in failure.reason
    assert cache.pin("t", toks(bs)).block_ids == (0,)
    if bs > 1:
        failure = cache.pin("t", toks(bs - 1))
        assert isinstance(failure, PinFailure) and "no full block" in failure.reason
    assert isinstance(cache.pin("u", toks(bs)), PinFailure)  # other namespace


def test_pin_cap_counts_shared_blocks_once(bs: int) -> None:
    cache = make_cache(8, bs)  # cap 4 blocks
    cached(cache, "a", "t", toks(3 * bs + 1))
    cached(cache, "b", "u", toks(2 * bs + 1))
    first = cache.pin("t", toks(3 * bs))
    second = cache.pin("t", toks(2 * bs))  # same blocks: no new ones
    assert isinstance(first, PinHandle) and isinstance(second, PinHandle)
    assert cache.stats().blocks_pinned == 3
    failure = cache.pin("u", toks(2 * bs))
    assert isinstance(failure, PinFailure) and not failure
    assert "cap" in failure.reason
    assert (failure.pinned_blocks, failure.num_new_blocks, failure.cap_blocks) == (3, 2, 4)
    cache.unpin(first)
    assert cache.stats().blocks_pinned == 2  # second still holds blocks 0, 1
    assert isinstance(cache.pin("u", toks(2 * bs)), PinHandle)
    assert cache.stats().blocks_pinned == 4


def test_pin_cap_fraction_zero_rejects_everything(bs: int) -> None:
    cache = make_cache(8, bs, pin_cap_fraction=0.0)
    cached(cache, "a", "t", toks(bs + 1))
    failure = cache.pin("t", toks(bs))
    assert isinstance(failure, PinFailure) and failure.cap_blocks == 0


def test_pinned_pool_makes_allocation_fail(bs: int) -> None:
    cache = make_cache(4, bs, pin_cap_fraction=1.0)
    cached(cache, "a", "t", toks(4 * bs))
    handle = cache.pin("t", toks(4 * bs))
    assert isinstance(handle, PinHandle)
    assert cache.allocate("b", "u", toks(1)) is None
    cache.unpin(handle)
    assert cache.allocate("b", "u", toks(1)).block_table == (3,)
