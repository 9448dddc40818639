"""check_integrity names the broken invariant."""

from __future__ import annotations

import pytest

from engine.core.kv import PrefixCache

from .conftest import toks


def make(bs: int = 2) -> PrefixCache:
    cache = PrefixCache(8, bs)
    cache.allocate("a", "t", toks(2 * bs + 1))
    cache.commit("a", bs)
    cache.check_integrity()
    return cache


def test_detects_wrong_ref_count() -> None:
    cache = make()
    cache.pool.blocks[0].ref_count += 1
    with pytest.raises(AssertionError, match="ref_count 2 != 1 holders"):
        cache.check_integrity()


def test_detects_held_block_in_free_deque() -> None:
    cache = make()
    cache.pool.free.append(cache.pool.blocks[2])
    with pytest.raises(AssertionError, match="free deque holds"):
        cache.check_integrity()


def test_detects_pending_block_of_a_gone_owner() -> None:
    cache = make()
    cache.pool.blocks[1].owner = "ghost"
    with pytest.raises(AssertionError, match="ghost"):
        cache.check_integrity()


def test_detects_stale_key_map() -> None:
    cache = make()
    cache.pool.blocks[0].key = b"x" * 16
    with pytest.raises(AssertionError, match=r"key mismatch|index key"):
        cache.check_integrity()


def test_detects_broken_child_link() -> None:
    cache = make()
    cache.pool.blocks[0].children.clear()
    with pytest.raises(AssertionError, match="missing from parent's children"):
        cache.check_integrity()


def test_detects_pin_accounting_drift() -> None:
    cache = make()
    cache.commit("a", 2 * 2 + 1)
    handle = cache.pin("t", toks(4))
    assert handle
    cache.pins.num_pinned += 1
    with pytest.raises(AssertionError, match="num_pinned"):
        cache.check_integrity()
