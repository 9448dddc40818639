"""Host tier: offload by priority, lookup across tiers, LOADING blocks, host pins, transfers."""

from __future__ import annotations

from engine.core.kv import BlockState, PinHandle, PriorityRange
from engine.core.kv.host_tier import HostTier
from engine.core.kv.prefix_cache import COPY_OWNER
from engine.core.kv.transfers import Direction, Transfer

from .conftest import make_cache, toks


def cached(cache, rid: str, ns: str, tokens: list[int], prio: int | None = None) -> None:
    ranges = (PriorityRange(0, None, prio),) if prio is not None else ()
    cache.allocate(rid, ns, tokens, ranges)
    cache.commit(rid, len(tokens))
    cache.free(rid)


def test_evicted_blocks_above_threshold_are_offloaded(bs: int) -> None:
    cache = make_cache(4, bs, host_blocks=8, block_bytes=100)
    cached(cache, "p", "t", toks(2 * bs))  # default priority 35: offloaded
    cached(cache, "d", "t", toks(2 * bs, base=500), prio=10)  # decode priority: dropped
    assert cache.evict(4) == 4
    plan = cache.take_transfers()
    assert [t.direction for t in plan.transfers] == [Direction.OUT] * 2
    assert sorted(t.slot for t in plan.transfers) == [0, 1]
    assert cache.take_transfers().is_empty  # taken once
    cache.finish_transfers(plan)
    stats = cache.stats()
    assert stats.host_blocks_cached == 2 and stats.blocks_offloaded == 2
    assert stats.bytes_offloaded == 200 and stats.blocks_cached == 0


def test_lookup_continues_into_the_host_and_restores_loading_blocks(bs: int) -> None:
    cache = make_cache(6, bs, host_blocks=8)
    prompt = toks(3 * bs)
    cached(cache, "p", "t", prompt)
    cache.evict(6)
    out = cache.take_transfers()
    cache.finish_transfers(out)
    alloc = cache.allocate("q", "t", [*prompt, 7])
    assert alloc.num_cached_tokens == 3 * bs
    assert alloc.match.states == (BlockState.LOADING,) * 3
    assert alloc.match.owners == (COPY_OWNER,) * 3
    assert cache.pending_deps("q") == {}  # copies run before the step's forward: no waiting
    plan = cache.take_transfers()
    slots = {t.block_id: t.slot for t in out.transfers}
    assert all(t.direction is Direction.IN for t in plan.transfers)
    assert [t.block_id for t in plan.transfers] == list(alloc.block_table[:3])
    assert len({t.slot for t in plan.transfers}) == 3 and set(slots.values()) >= {
        t.slot for t in plan.transfers
    }
    cache.finish_transfers(plan, elapsed_us=42)
    assert cache.inner.lookup("t", [*prompt, 7]).states == (BlockState.READY,) * 3
    stats = cache.stats()
    assert stats.host_hit_tokens == 3 * bs and stats.hit_tokens == 3 * bs
    assert stats.blocks_restored == 3 and stats.transfer_us == 42
    assert stats.host_blocks_cached == 3  # copy semantics: the host keeps its copy


def test_aborted_request_leaves_loading_blocks_unreclaimable_until_copied(bs: int) -> None:
    cache = make_cache(4, bs, host_blocks=4)
    prompt = toks(2 * bs)
    cached(cache, "p", "t", prompt)
    cache.evict(4)
    cache.finish_transfers(cache.take_transfers())
    cache.allocate("q", "t", [*prompt, 1])
    plan = cache.take_transfers()
    cache.free("q")  # abort while the copy is in flight
    assert cache.stats().blocks_free == 2  # the two LOADING blocks are not reclaimable
    assert cache.evict(4) == 0
    cache.finish_transfers(plan)
    assert cache.stats().blocks_free == 4
    assert cache.lookup("t", [*prompt, 1]).num_tokens == 2 * bs


def test_pins_beyond_the_device_cap_live_in_the_host(bs: int) -> None:
    cache = make_cache(8, bs, pin_cap_fraction=0.25, host_blocks=4)  # device cap: 2 blocks
    cached(cache, "a", "a", toks(2 * bs))
    cached(cache, "b", "b", toks(2 * bs))
    dev = cache.pin("a", toks(2 * bs))
    assert isinstance(dev, PinHandle) and dev.tier == "device"
    host = cache.pin("b", toks(2 * bs))
    assert isinstance(host, PinHandle) and host.tier == "host" and host.block_ids == ()
    assert [t.direction for t in cache.take_transfers().transfers] == [Direction.OUT] * 2
    stats = cache.stats()
    assert stats.blocks_pinned == 2 and stats.host_blocks_pinned == 2
    # the host pin survives device eviction and host pressure, and is restored on demand
    cache.evict(8)
    for i in range(6):
        cached(cache, f"x{i}", f"x{i}", toks(2 * bs, base=100 + i))
        cache.evict(8)
    assert cache.stats().host_blocks_pinned == 2
    assert cache.allocate("c", "b", [*toks(2 * bs), 5]).num_cached_tokens == 2 * bs
    cache.unpin(host)
    cache.unpin(host)  # idempotent
    assert cache.stats().host_blocks_pinned == 0 and cache.stats().blocks_pinned == 2


def test_host_pin_fails_cleanly_when_the_host_is_pinned_full(bs: int) -> None:
    cache = make_cache(8, bs, pin_cap_fraction=0.0, host_blocks=2)
    cached(cache, "a", "a", toks(2 * bs))
    cached(cache, "b", "b", toks(2 * bs))
    assert cache.pin("a", toks(2 * bs)).tier == "host"
    failure = cache.pin("b", toks(2 * bs))
    assert not failure and "host tier full" in failure.reason


def test_disabled_host_tier_drops_evicted_blocks() -> None:
    cache = make_cache(4, 4)
    cached(cache, "p", "t", toks(8))
    assert cache.evict(4) == 2
    assert cache.take_transfers().is_empty
    assert cache.stats().host_blocks_total == 0


def test_host_reclaims_leaves_first_by_priority_then_lru() -> None:
    dropped: list[bytes] = []
    host = HostTier(3, threshold=20, on_drop=dropped.append)
    a = host.store(b"a", None, 50, tick=1)
    host.store(b"b", b"a", 50, tick=2)  # child of a: a is no longer a leaf
    host.store(b"c", None, 30, tick=3)
    assert a is not None and not a.reclaimable
    host.store(b"d", None, 90, tick=4)  # full: the lowest-priority leaf goes (c)
    assert dropped == [b"c"]
    host.store(b"e", None, 90, tick=5)  # then b (leaf, 50), never its parent a first
    assert dropped == [b"c", b"b"]
    host.check_integrity()
    assert Transfer(Direction.IN, 1, 2).slot == 2
