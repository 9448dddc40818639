"""Cache scopes: one tenant's end users share its prefix blocks and nothing after them."""

from __future__ import annotations

import pytest

from engine.core.kv import BlockState, CacheScope, PinHandle
from engine.core.kv.hashing import block_keys, root_key, scope_parent

from .conftest import make_cache, toks

READY = BlockState.READY


def scope(salt: str, shared: int) -> CacheScope:
    return CacheScope(salt, shared)


def test_scoped_keys_equal_the_namespace_keys_up_to_the_shared_blocks(bs: int) -> None:
    ids = toks(5 * bs + 1, base=3)
    shared = 2 * bs + bs // 2  # 2.5 blocks: block 2 straddles the end, so it is private
    root = root_key("tenant")
    plain = block_keys(root, ids, bs, 0, 5)
    a = block_keys(root, ids, bs, 0, 5, scope("visitor-a", shared))
    b = block_keys(root, ids, bs, 0, 5, scope("visitor-b", shared))
    split = shared // bs
    assert a[:split] == b[:split] == plain[:split]
    assert not set(a[split:]) & set(b[split:]) and not set(a[split:]) & set(plain)
    # the rule spelled out: the first private block chains from H'(last shared key | salt)
    assert a[split:] == block_keys(scope_parent(plain[split - 1], b"visitor-a"), ids, bs, split, 5)


def test_scoped_keys_are_incremental_from_any_block(bs: int) -> None:
    ids = toks(6 * bs, base=11)
    sc = scope("v", 3 * bs)
    full = block_keys(root_key("t"), ids, bs, 0, 6, sc)
    for first in range(1, 6):  # before, at and after the first private block (3)
        assert block_keys(full[first - 1], ids, bs, first, 6, sc) == full[first:]


def test_a_scope_without_shared_tokens_keys_every_block_privately(bs: int) -> None:
    ids = toks(3 * bs)
    plain = block_keys(root_key("t"), ids, bs, 0, 3)
    private = block_keys(root_key("t"), ids, bs, 0, 3, scope("v", 0))
    assert not set(plain) & set(private)
    assert private[0] == block_keys(scope_parent(root_key("t"), b"v"), ids, bs, 0, 1)[0]


def test_scope_salt_as_str_is_its_utf8_bytes_and_bad_scopes_are_refused() -> None:
    assert CacheScope("vé", 4) == CacheScope("vé".encode(), 4)
    for salt, shared in ((b"", 1), ("", 1), (b"s", -1), (b"s", True), (1, 1)):
        with pytest.raises(ValueError):
            CacheScope(salt, shared)  # type: ignore[arg-type]


def test_a_visitor_hits_the_shared_prefix_and_only_its_own_conversation(bs: int) -> None:
    cache = make_cache(32, bs)
    shared = 2 * bs + bs // 2
    convo = toks(5 * bs + 1, base=100)
    va, vb = scope("a", shared), scope("b", shared)
    cache.allocate("a1", "t", convo, scope=va)
    cache.commit("a1", len(convo))
    cache.free("a1")
    # B sends A's exact conversation: only the blocks wholly inside the shared prefix match
    assert cache.lookup("t", convo, vb).num_tokens == shared // bs * bs
    alloc = cache.allocate("b1", "t", convo, scope=vb)
    assert alloc.num_cached_tokens == shared // bs * bs
    # A sending it again finds its own blocks beyond the prefix
    again = cache.allocate("a2", "t", [*convo, 7], scope=va)
    assert again.num_cached_tokens == len(convo) // bs * bs
    # an unscoped request of the namespace (a key without end user) is one more scope
    assert cache.lookup("t", convo).num_tokens == shared // bs * bs


def test_the_shared_blocks_are_one_set_of_blocks_for_every_scope(bs: int) -> None:
    cache = make_cache(32, bs)
    prefix = toks(2 * bs, base=50)
    cache.allocate("pin", "t", [*prefix, 1])  # the tenant prompt, computed unscoped
    cache.commit("pin", 2 * bs + 1)
    cache.free("pin")
    handle = cache.pin("t", prefix)
    assert isinstance(handle, PinHandle)
    tables = []
    for v in ("a", "b"):
        alloc = cache.allocate(v, "t", [*prefix, *toks(bs + 1, base=9)], scope=scope(v, 2 * bs))
        assert alloc.num_cached_tokens == 2 * bs and alloc.match.states == (READY, READY)
        tables.append(alloc.block_table)
    assert tables[0][:2] == tables[1][:2] == handle.block_ids
    assert tables[0][2:] != tables[1][2:]  # each visitor's own blocks


def test_decode_growth_keeps_the_scope_of_the_admission(bs: int) -> None:
    cache = make_cache(32, bs)
    sc = scope("a", bs)
    seq = toks(bs + 1, base=5)
    cache.allocate("a", "t", seq, scope=sc)
    for step in range(2 * bs):  # later calls omit the scope, as the scheduler's do
        seq.append(700 + step)
        cache.allocate("a", "t", seq)
    cache.commit("a", len(seq))
    cache.free("a")
    assert cache.lookup("t", [*seq, 1], sc).num_tokens == len(seq) // bs * bs
    assert cache.lookup("t", [*seq, 1], scope("b", bs)).num_tokens == bs
    cache.allocate("c", "t", seq, scope=sc)
    with pytest.raises(ValueError, match="another cache scope"):
        cache.allocate("c", "t", [*seq, 1], scope=scope("b", bs))


def test_a_refused_admission_is_not_retried_under_another_scope(bs: int) -> None:
    cache = make_cache(3, bs)
    cache.allocate("x", "t", toks(2 * bs))
    prompt = toks(2 * bs + 1, base=900)
    assert cache.allocate("r", "t", prompt, scope=scope("a", 0)) is None
    cache.free("x")
    alloc = cache.allocate("r", "t", prompt, scope=scope("b", 0))  # same id, new scope
    cache.commit("r", len(prompt))
    assert alloc is not None
    assert cache.lookup("t", prompt, scope("b", 0)).block_ids == alloc.block_table[:2]
    assert cache.lookup("t", prompt, scope("a", 0)).block_ids == ()


def test_integrity_check_catches_a_key_outside_the_rule(bs: int) -> None:
    cache = make_cache(8, bs)
    cache.allocate("a", "t", toks(2 * bs), scope=scope("a", bs))
    state = cache.inner.requests["a"]
    unscoped = block_keys(root_key("t"), state.tokens, bs, 0, 2)
    state.keys[1] = unscoped[1]  # as if the growth path had forgotten the scope
    with pytest.raises(AssertionError, match="key rule"):
        cache.inner.check_integrity()
