"""lookup / allocate / commit / pending_deps / free, including early reuse and handoff."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from engine.core.kv import BlockState, Handoff

from .conftest import make_cache, toks

READY = BlockState.READY
PENDING = BlockState.PENDING


def test_admission_takes_fresh_blocks_in_order(bs: int) -> None:
    cache = make_cache(16, bs)
    alloc = cache.allocate("a", "t", toks(2 * bs + 1))
    assert alloc.block_table == (0, 1, 2)
    assert alloc.num_cached_tokens == 0 and alloc.match.block_ids == ()
    stats = cache.stats()
    assert stats.blocks_in_use == 3 and stats.blocks_free == 13
    assert stats.blocks_pending == (2 * bs + 1) // bs
    assert stats.query_tokens == 2 * bs + 1 and stats.hit_tokens == 0


def test_lookup_caps_so_last_token_is_computed(bs: int) -> None:
    cache = make_cache(16, bs)
    cache.allocate("a", "t", toks(3 * bs))
    cache.commit("a", 3 * bs)
    assert cache.lookup("t", toks(3 * bs)).block_ids == (0, 1)
    assert cache.lookup("t", toks(3 * bs + 1)).block_ids == (0, 1, 2)
    assert cache.lookup("t", toks(1)).block_ids == ()


def test_lookup_is_pure(bs: int) -> None:
    cache = make_cache(16, bs)
    cache.allocate("a", "t", toks(2 * bs + 1))
    before = cache.stats()
    match = cache.lookup("t", toks(2 * bs + 1))
    assert match.block_ids == (0, 1) and match.states == (PENDING, PENDING)
    assert match.owners == ("a", "a") and match.num_tokens == 2 * bs
    assert cache.stats() == before


def test_ready_hit_after_commit_and_free(bs: int) -> None:
    cache = make_cache(16, bs)
    cache.allocate("a", "t", toks(2 * bs + 1))
    cache.commit("a", 2 * bs + 1)
    assert cache.free("a") == []
    assert cache.stats().blocks_cached == (2 * bs + 1) // bs
    assert cache.stats().blocks_in_use == 0
    alloc = cache.allocate("b", "t", toks(3 * bs))
    assert alloc.match.block_ids == (0, 1) and alloc.match.states == (READY, READY)
    assert alloc.match.owners == (None, None)
    assert alloc.num_cached_tokens == 2 * bs
    # blocks 3.. were never used: they leave the free deque first
    assert alloc.block_table == (0, 1, 3)
    assert cache.pending_deps("b") == {}
    stats = cache.stats()
    assert stats.hit_tokens == 2 * bs and stats.query_tokens == 5 * bs + 1


def test_namespaces_never_share(bs: int) -> None:
    cache = make_cache(16, bs)
    cache.allocate("a", "t1", toks(2 * bs + 1))
    cache.commit("a", 2 * bs + 1)
    assert cache.lookup("t2", toks(2 * bs + 1)).block_ids == ()
    alloc = cache.allocate("b", "t2", toks(2 * bs + 1))
    assert alloc.block_table == (3, 4, 5) and alloc.num_cached_tokens == 0


def test_early_reuse_attaches_to_pending_blocks(bs: int) -> None:
    cache = make_cache(16, bs)
    cache.allocate("a", "t", toks(3 * bs + 1))
    alloc = cache.allocate("b", "t", toks(4 * bs))
    assert alloc.match.block_ids == (0, 1, 2)
    assert alloc.match.states == (PENDING,) * 3 and alloc.match.owners == ("a",) * 3
    assert alloc.block_table == (0, 1, 2, 4)
    assert cache.pending_deps("b") == {"a": 3 * bs}
    assert cache.pending_deps("a") == {}
    cache.commit("a", 2 * bs)  # chunked prefill: first two blocks written
    assert cache.pending_deps("b") == {"a": 3 * bs}
    cache.commit("a", 3 * bs + 1)
    assert cache.pending_deps("b") == {}
    assert cache.lookup("t", toks(4 * bs)).states == (READY,) * 3


def test_commit_marks_only_fully_covered_blocks(bs: int) -> None:
    cache = make_cache(16, bs)
    cache.allocate("a", "t", toks(3 * bs))
    cache.commit("a", 2 * bs - 1)
    ready = (2 * bs - 1) // bs
    states = cache.lookup("t", toks(3 * bs + 1)).states
    assert states == (READY,) * ready + (PENDING,) * (3 - ready)
    cache.commit("a", 3 * bs)
    assert cache.lookup("t", toks(3 * bs + 1)).states == (READY,) * 3


def test_out_of_order_commits_keep_ready_parents(bs: int) -> None:
    cache = make_cache(16, bs)
    cache.allocate("a", "t", toks(bs + 1))  # owns block 0
    cache.allocate("b", "t", toks(2 * bs + 1))  # attaches block 0, owns block 1 (id 2)
    cache.commit("b", 2 * bs + 1)  # b's block waits: its parent is not written yet
    assert cache.lookup("t", toks(2 * bs + 1)).states == (PENDING, PENDING)
    cache.commit("a", bs + 1)
    assert cache.lookup("t", toks(2 * bs + 1)).states == (READY, READY)


def test_free_drops_uncomputed_unshared_blocks(bs: int) -> None:
    cache = make_cache(8, bs)
    cache.allocate("a", "t", toks(2 * bs + 1))
    assert cache.free("a") == []  # aborted before computing anything
    stats = cache.stats()
    assert stats.blocks_free == 8 and stats.blocks_pending == 0 and stats.blocks_cached == 0
    assert cache.lookup("t", toks(2 * bs + 1)).block_ids == ()
    assert cache.allocate("b", "t", toks(bs)).block_table == (3,)  # FIFO free deque
    assert cache.free("missing") == []


def test_free_hands_pending_blocks_to_earliest_attached(bs: int) -> None:
    cache = make_cache(16, bs)
    cache.allocate("a", "t", toks(3 * bs + 1))
    cache.allocate("b", "t", toks(3 * bs + 2))
    cache.allocate("c", "t", toks(2 * bs + 1))
    cache.commit("a", bs)  # block 0 written, blocks 1 and 2 not
    handoffs = cache.free("a")
    assert handoffs == [Handoff("b", bs)]
    match = cache.lookup("t", toks(3 * bs + 1))
    assert match.block_ids == (0, 1, 2) and match.owners == (None, "b", "b")
    assert cache.pending_deps("c") == {"b": 2 * bs}
    assert cache.pending_deps("b") == {}
    cache.commit("b", 3 * bs + 2)
    assert cache.pending_deps("c") == {}
    assert cache.lookup("t", toks(3 * bs + 1)).states == (READY,) * 3


def test_handoff_only_of_blocks_the_heir_holds(bs: int) -> None:
    cache = make_cache(16, bs)
    cache.allocate("a", "t", toks(3 * bs + 1))
    cache.allocate("b", "t", toks(bs + 1))  # holds block 0 only
    assert cache.free("a") == [Handoff("b", 0)]
    match = cache.lookup("t", toks(3 * bs + 1))
    assert match.block_ids == (0,) and match.owners == ("b",)
    assert cache.stats().blocks_pending == 1


def test_heir_gone_too_passes_on_or_drops(bs: int) -> None:
    cache = make_cache(16, bs)
    cache.allocate("a", "t", toks(2 * bs + 1))
    cache.allocate("b", "t", toks(2 * bs + 1))
    cache.allocate("c", "t", toks(2 * bs + 1))
    assert cache.free("a") == [Handoff("b", 0)]
    assert cache.free("b") == [Handoff("c", 0)]
    assert cache.pending_deps("c") == {}
    assert cache.free("c") == []
    assert cache.stats().blocks_free == 16 and cache.stats().blocks_pending == 0


def test_decode_growth_keys_new_full_blocks(bs: int) -> None:
    cache = make_cache(16, bs)
    prompt = toks(bs + 1)
    cache.allocate("a", "t", prompt)
    seq = list(prompt)
    for step in range(2 * bs):
        seq.append(1000 + step)
        alloc = cache.allocate("a", "t", seq)
        assert alloc is not None and len(alloc.block_table) == -(-len(seq) // bs)
        cache.commit("a", len(seq) - 1)
    cache.commit("a", len(seq))
    cache.free("a")
    # the next turn reuses the prompt and the generated tokens
    nxt = cache.lookup("t", [*seq, 7])
    assert nxt.num_tokens == (len(seq) // bs) * bs and set(nxt.states) == {READY}


def test_block_taken_by_another_key_holder_stays_private(bs: int) -> None:
    cache = make_cache(16, bs)
    cache.allocate("a", "t", toks(2 * bs))
    cache.commit("a", 2 * bs)
    alloc = cache.allocate("b", "t", toks(2 * bs))  # capped: block 1 recomputed privately
    assert alloc.block_table == (0, 2) and alloc.num_cached_tokens == bs
    cache.commit("b", 2 * bs)
    cache.free("b")
    assert cache.stats().blocks_cached == 2


def test_allocate_returns_none_and_changes_nothing_when_full(bs: int) -> None:
    cache = make_cache(4, bs)
    cache.allocate("a", "t", toks(3 * bs))
    before = cache.stats()
    assert cache.allocate("b", "u", toks(2 * bs)) is None
    assert cache.stats() == before and cache.lookup("u", toks(2 * bs)).block_ids == ()
    assert cache.allocate("a", "t", toks(5 * bs)) is None
    assert cache.stats() == before
    assert cache.allocate("a", "t", toks(4 * bs)).block_table == (0, 1, 2, 3)


def test_allocate_validates_input(bs: int) -> None:
    cache = make_cache(8, bs)
    cache.allocate("a", "t", toks(bs + 1))
    with pytest.raises(ValueError):
        cache.allocate("a", "other", toks(bs + 2))
    with pytest.raises(ValueError):
        cache.allocate("a", "t", toks(bs))  # token ids only grow
    with pytest.raises(ValueError):
        cache.allocate("b", "t", [])


def test_reuse_disabled_shares_nothing(bs: int) -> None:
    cache = make_cache(16, bs, enable_reuse=False)
    cache.allocate("a", "t", toks(2 * bs + 1))
    cache.commit("a", 2 * bs + 1)
    assert cache.lookup("t", toks(2 * bs + 1)).block_ids == ()
    assert cache.allocate("b", "t", toks(2 * bs + 1)).block_table == (3, 4, 5)
    cache.free("a")
    stats = cache.stats()
    assert stats.blocks_cached == 0 and stats.blocks_pending == 0 and stats.blocks_free == 13
    assert not cache.pin("t", toks(2 * bs))


def test_bad_block_size_rejected() -> None:
    for size in (0, 3, 128):
        with pytest.raises(ValueError):
            make_cache(8, size)


def test_pending_deps_lists_every_owner(bs: int) -> None:
    cache = make_cache(16, bs)
    cache.allocate("a", "t", toks(bs))  # owns block 0
    cache.allocate("b", "t", toks(2 * bs + 1))  # attaches block 0, owns block 1
    alloc = cache.allocate("c", "t", toks(3 * bs))
    assert alloc.match.block_ids == (0, 1) and alloc.match.owners == ("a", "b")
    assert cache.pending_deps("c") == {"a": bs, "b": 2 * bs}
    cache.commit("a", bs)
    assert cache.pending_deps("c") == {"b": 2 * bs}
    cache.commit("b", 2 * bs + 1)
    assert cache.pending_deps("c") == {}


def test_preempted_request_readmits_onto_its_own_blocks(bs: int) -> None:
    cache = make_cache(16, bs)
    seq = toks(3 * bs + 1)
    cache.allocate("a", "t", seq)
    cache.commit("a", len(seq))
    assert cache.free("a") == []  # preempted: computed blocks stay cached
    alloc = cache.allocate("a", "t", seq)
    assert alloc.num_cached_tokens == 3 * bs and alloc.block_table[:3] == (0, 1, 2)


def test_decode_hashes_each_block_once(bs: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.core.kv.index as index_mod

    hashed: list[int] = []
    real = index_mod.block_keys

    def counting(parent, token_ids, block_size, first, last, scope=None):  # type: ignore[no-untyped-def]
        hashed.append(max(0, last - first))
        return real(parent, token_ids, block_size, first, last, scope)

    monkeypatch.setattr(index_mod, "block_keys", counting)
    cache = make_cache(32, bs)
    seq = toks(2 * bs + 1)
    cache.allocate("a", "t", seq)
    assert sum(hashed) == len(seq) // bs
    for step in range(3 * bs):
        seq.append(900 + step)
        cache.allocate("a", "t", seq)
    assert sum(hashed) == len(seq) // bs  # every full block hashed exactly once


def test_refused_admission_is_retried_without_rehashing(
    bs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import engine.core.kv.index as index_module

    hashed: list[int] = []
    real = index_module.block_keys

    def counting(parent: bytes, token_ids: Sequence[int], *rest: int) -> list[bytes]:
        hashed.append(len(token_ids))
        return real(parent, token_ids, *rest)

    monkeypatch.setattr(index_module, "block_keys", counting)
    cache = make_cache(4, bs)
    cache.allocate("a", "t", toks(3 * bs))
    prompt = toks(2 * bs + 1, base=1000)
    hashed.clear()
    assert cache.allocate("b", "t", prompt) is None
    assert cache.allocate("b", "t", prompt) is None
    assert len(hashed) == 1  # the retry reused the keys of the refused attempt
    # Same id, other tokens (an aborted request's id reused): keys of the new tokens.
    other = toks(2 * bs + 1, base=5000)
    assert cache.allocate("b", "t", other) is None
    assert len(hashed) == 2
    cache.free("a")
    alloc = cache.allocate("b", "t", other)
    cache.commit("b", len(other))
    assert cache.lookup("t", other).block_ids == alloc.block_table[:2]
    assert cache.lookup("t", prompt).block_ids == ()
