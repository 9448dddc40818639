"""The device <-> host tier moves of ``PrefixCache``: offload, restore, host pins, transfers.

Where a keyed block lives, by its device state (``H`` = the key also has a host entry)::

    device READY          K/V on the device (and in the host too when H)
    device LOADING        being copied in from its host entry (H always); read only after the
                          copy, which the runner does before the step's forward
    no device block, H    host only: a lookup continues from the device chain into it
    device PENDING        being computed on the device (H possible: an older host copy)

Offload: a READY idle leaf evicted from the device with priority >= the host threshold is copied
out (unless its key is already in the host). Restore: an admission whose device chain ends on a
READY block continues into host entries; each gets a fresh device block registered LOADING.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.kv.block import Block, BlockState
from engine.kv.host_tier import HostEntry, HostTier
from engine.kv.request import RequestState
from engine.kv.transfers import EMPTY_PLAN, Direction, Transfer, TransferPlan
from engine.kv.types import DEVICE, HOST, PinFailure, PinHandle

if TYPE_CHECKING:
    from engine.kv.prefix_cache import PrefixCache


@dataclass
class TierState:
    host: HostTier
    block_bytes: int = 0  # bytes of one block (K and V, all layers), for stats only
    queue: list[Transfer] = field(default_factory=list)  # planned, not yet taken by the runner
    loading: dict[int, Block] = field(default_factory=dict)  # LOADING device blocks by id
    host_hit_tokens: int = 0
    blocks_out: int = 0
    blocks_in: int = 0
    restore_us: int = 0  # time the runner spent on transfers (reported by the engine)
    snapshot_restores: int = 0  # prompts restored from disk (engine/snapshot_restore.py)
    snapshot_us: int = 0  # time those restores took (read, check, copy into the device)


def notify(cache: PrefixCache, key: bytes, tier: str | None) -> None:
    """Tell a listener that cares (``on_tier``) where ``key`` lives now (None: nowhere)."""
    hook = getattr(cache.listener, "on_tier", None)
    if hook is not None:
        hook(key, tier)


def host_continuation(
    cache: PrefixCache, matched: list[Block], keys: list[bytes | None], cap: int
) -> list[HostEntry]:
    """Host entries continuing a device chain (``matched``, the device hits among ``keys[:cap]``)
    that ends on a READY block or is empty."""
    host = cache.tiers.host
    if not host.entries or (matched and matched[-1].state is not BlockState.READY):
        return []
    return host.match(keys[len(matched) : cap])


def restore(cache: PrefixCache, seq: RequestState, first: int, entries: list[HostEntry]) -> None:
    """Blocks first.. of ``seq`` (fresh) take the keys of ``entries``: LOADING, copy in queued.
    ``entries`` were held by the caller while it allocated; they are released here."""
    tiers, host = cache.tiers, cache.tiers.host
    for i, entry in enumerate(entries):
        pos = first + i
        block = seq.blocks[pos]
        parent = seq.blocks[pos - 1] if pos else None
        added = cache.index.add(entry.key, block)
        assert added, "a host key is also registered on the device"
        block.key = entry.key
        block.state = BlockState.LOADING
        block.pos = pos
        block.parent = parent
        if parent is not None:
            parent.children.add(block)
        host.touch(entry, block.priority, cache._tick)
        tiers.queue.append(Transfer(Direction.IN, block.block_id, entry.slot))
        tiers.loading[block.block_id] = block
        tiers.blocks_in += 1
    host.release(entries)
    tiers.host_hit_tokens += len(entries) * cache.block_size


def offload(cache: PrefixCache, block: Block) -> None:
    """``block`` (READY, being evicted from the device) goes to the host tier if it qualifies."""
    host, key = cache.tiers.host, block.key
    assert key is not None
    entry = host.get(key)
    if entry is not None:
        host.touch(entry, block.priority, cache._tick)  # already there: nothing to copy
        return
    if not host.wants(block.priority):
        return
    parent = block.parent.key if block.parent is not None else None
    entry = host.store(key, parent, block.priority, cache._tick)
    if entry is None:
        return
    cache.tiers.queue.append(Transfer(Direction.OUT, block.block_id, entry.slot))
    cache.tiers.blocks_out += 1
    notify(cache, key, HOST)


def pin_in_host(
    cache: PrefixCache, namespace: str, blocks: list[Block], num_tokens: int, why: PinFailure
) -> PinHandle | PinFailure:
    """Pin READY device ``blocks`` in the host tier (copied out where not there yet)."""
    tiers, host = cache.tiers, cache.tiers.host
    if host.num_blocks == 0:
        return why
    entries: list[HostEntry] = []
    for block in blocks:
        entry = host.get(block.key)
        if entry is None:
            parent = block.parent.key if block.parent is not None else None
            entry = host.store(block.key, parent, block.priority, cache._tick)  # type: ignore[arg-type]
            if entry is None:
                host.release(entries)
                return PinFailure(
                    f"{why.reason}; host tier full ({host.num_pinned} of {host.num_blocks} "
                    "host blocks pinned)",
                    num_blocks=len(blocks),
                    pinned_blocks=host.num_pinned,
                    cap_blocks=host.num_blocks,
                )
            tiers.queue.append(Transfer(Direction.OUT, block.block_id, entry.slot))
            tiers.blocks_out += 1
            notify(cache, entry.key, HOST)
        host.hold([entry])
        entries.append(entry)
    pin_id = cache.pins.new_id()
    host.pin(pin_id, entries)
    host.release(entries)
    return PinHandle(pin_id, namespace, (), num_tokens, tier=HOST)


def take(cache: PrefixCache) -> TransferPlan:
    tiers = cache.tiers
    if not tiers.queue:
        return EMPTY_PLAN
    plan = TransferPlan(tuple(tiers.queue))
    tiers.queue.clear()
    return plan


def finish(cache: PrefixCache, plan: TransferPlan, elapsed_us: int = 0) -> None:
    """The runner performed ``plan``: its restored blocks are READY (idle when unheld)."""
    tiers = cache.tiers
    tiers.restore_us += elapsed_us
    for t in plan.transfers:
        if t.direction is not Direction.IN:
            continue
        block = tiers.loading.pop(t.block_id)
        block.state = BlockState.READY
        notify(cache, block.key, DEVICE)  # type: ignore[arg-type]
        if block.ref_count == 0 and block.pin_count == 0:
            block.last_access = cache._tick
            cache.pool.mark_idle(block)


def check_tiers(cache: PrefixCache) -> None:
    tiers = cache.tiers
    tiers.host.check_integrity()
    queued_in = {t.block_id for t in tiers.queue if t.direction is Direction.IN}
    for block in cache.pool.blocks:
        if block.state is BlockState.LOADING:
            assert tiers.loading.get(block.block_id) is block, f"{block!r} not tracked as loading"
            assert block.owner is None and block.pin_count == 0, f"LOADING {block!r} owned/pinned"
            parent = block.parent
            assert parent is None or parent.state in (BlockState.READY, BlockState.LOADING), (
                f"LOADING {block!r} under {parent!r}"
            )
    for bid, block in tiers.loading.items():
        assert block.state is BlockState.LOADING, f"{block!r} tracked as loading"
        assert block.block_id == bid
    assert queued_in <= set(tiers.loading), "a queued copy-in targets a block not LOADING"
    bs = cache.block_size
    for rid, seq in cache.requests.items():
        for block in seq.blocks[: -(-seq.num_computed // bs)]:
            assert block.state is not BlockState.LOADING, (
                f"{rid!r} committed tokens of {block!r} before its copy completed"
            )


def stats(cache: PrefixCache) -> dict[str, int]:
    """The tier fields of ``CacheStats``."""
    tiers, host = cache.tiers, cache.tiers.host
    return {
        "host_blocks_total": host.num_blocks,
        "host_blocks_cached": len(host),
        "host_blocks_pinned": host.num_pinned,
        "host_hit_tokens": tiers.host_hit_tokens,
        "blocks_offloaded": tiers.blocks_out,
        "blocks_restored": tiers.blocks_in,
        "bytes_offloaded": tiers.blocks_out * tiers.block_bytes,
        "bytes_restored": tiers.blocks_in * tiers.block_bytes,
        "transfer_us": tiers.restore_us,
        "snapshot_restores": tiers.snapshot_restores,
        "snapshot_restore_us": tiers.snapshot_us,
    }
