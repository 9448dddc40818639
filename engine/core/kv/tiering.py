"""``Tiering``: the device <-> host tier moves of ``PrefixCache`` (offload, restore, host pins,
transfers), and the state they need, owned here.

Where a keyed block lives, by its device state (``H`` = the key also has a host entry)::

    device READY          K/V on the device (and in the host too when H)
    device LOADING        being copied in from its host entry (H always); read only after the
                          copy, which the runner does before the step's forward
    no device block, H    host only: a lookup continues from the device chain into it
    device PENDING        being computed on the device (H possible: an older host copy)

Offload: a READY idle leaf evicted from the device with priority >= the host threshold is copied
out (unless its key is already in the host). Restore: an admission whose device chain ends on a
READY block continues into host entries; each gets a fresh device block registered LOADING.

Division of labour with the cache: the cache owns the device blocks, their links, the key index,
the pool and the logical clock (passed in as ``tick``); ``Tiering`` owns the host tier, the queue
of planned copies, the LOADING blocks awaiting their copy, and the tier counters. The cache links
a restored block into its chain; ``Tiering`` only records the copy it needs.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.core.kv.block import Block, BlockState
from engine.core.kv.host_tier import HostEntry, HostTier
from engine.core.kv.request import RequestState
from engine.core.kv.transfers import EMPTY_PLAN, Direction, Transfer, TransferPlan
from engine.core.kv.types import DEVICE, HOST, CacheListener, PinFailure, PinHandle


class Tiering:
    def __init__(
        self,
        host_blocks: int,
        threshold: int,
        block_size: int,
        *,
        block_bytes: int = 0,
        listener: CacheListener | None = None,
    ) -> None:
        self.host = HostTier(host_blocks, threshold, lambda key: self._notify(key, None))
        self.block_size = block_size
        self.block_bytes = block_bytes  # bytes of one block (K and V, all layers), stats only
        self._listener = listener
        self._queue: list[Transfer] = []  # planned, not yet taken by the runner
        self._loading: dict[int, Block] = {}  # LOADING device blocks by id
        self.host_hit_tokens = 0
        self.blocks_out = 0
        self.blocks_in = 0
        self.restore_us = 0  # time the runner spent on transfers (reported by the engine)
        # prompts restored from disk (engine/runtime/snapshot_restore.py)
        self.snapshot_restores = 0
        self.snapshot_us = 0  # time those restores took (read, check, copy into the device)

    def _notify(self, key: bytes, tier: str | None) -> None:
        """Tell a listener that cares (``on_tier``) where ``key`` lives now (None: nowhere)."""
        hook = getattr(self._listener, "on_tier", None)
        if hook is not None:
            hook(key, tier)

    # ---------------------------------------------------------------- admission

    def continuation(
        self, matched: list[Block], keys: list[bytes | None], cap: int
    ) -> list[HostEntry]:
        """Host entries continuing a device chain (``matched``, the device hits among
        ``keys[:cap]``) that ends on a READY block or is empty; pure."""
        if not self.host.entries or (matched and matched[-1].state is not BlockState.READY):
            return []
        return self.host.match(keys[len(matched) : cap])

    def hold(self, entries: list[HostEntry]) -> None:
        """Keep ``continuation``'s entries while an admission allocates (evictions on the way
        may offload, and must not reclaim them); ``restore`` releases them."""
        self.host.hold(entries)

    def restore(self, blocks: list[Block], entries: list[HostEntry], tick: int) -> None:
        """``blocks`` (fresh device blocks the cache registered LOADING under the keys of
        ``entries``, in order) take their copy in; the held ``entries`` are released."""
        for block, entry in zip(blocks, entries, strict=True):
            assert block.state is BlockState.LOADING and block.key == entry.key
            self.host.touch(entry, block.priority, tick)
            self._queue.append(Transfer(Direction.IN, block.block_id, entry.slot))
            self._loading[block.block_id] = block
        self.blocks_in += len(entries)
        self.host.release(entries)
        self.host_hit_tokens += len(entries) * self.block_size

    # ---------------------------------------------------------------- eviction / pins

    def offload(self, block: Block, tick: int) -> None:
        """``block`` (READY, being evicted from the device) goes to the host tier if it
        qualifies; one already there is only touched (nothing to copy)."""
        key = block.key
        assert key is not None
        entry = self.host.get(key)
        if entry is not None:
            self.host.touch(entry, block.priority, tick)
            return
        if not self.host.wants(block.priority):
            return
        self._copy_out(block, tick)

    def _copy_out(self, block: Block, tick: int) -> HostEntry | None:
        """A new host entry for READY ``block``, its copy queued; None when the host is full."""
        assert block.key is not None
        parent = block.parent.key if block.parent is not None else None
        entry = self.host.store(block.key, parent, block.priority, tick)
        if entry is None:
            return None
        self._queue.append(Transfer(Direction.OUT, block.block_id, entry.slot))
        self.blocks_out += 1
        self._notify(block.key, HOST)
        return entry

    def hold_for_pin(
        self, blocks: list[Block], why: PinFailure, tick: int
    ) -> list[HostEntry] | PinFailure:
        """Host entries of READY device ``blocks`` (copied out where not there yet), held for
        ``pin``; ``why`` (the device refusal) when there is no host tier, or a failure naming
        the full host tier."""
        host = self.host
        if host.num_blocks == 0:
            return why
        entries: list[HostEntry] = []
        for block in blocks:
            entry = host.get(block.key)
            if entry is None:
                entry = self._copy_out(block, tick)
            if entry is None:
                host.release(entries)
                return PinFailure(
                    f"{why.reason}; host tier full ({host.num_pinned} of {host.num_blocks} "
                    "host blocks pinned)",
                    num_blocks=len(blocks),
                    pinned_blocks=host.num_pinned,
                    cap_blocks=host.num_blocks,
                )
            host.hold([entry])
            entries.append(entry)
        return entries

    def pin(
        self, pin_id: int, namespace: str, entries: list[HostEntry], num_tokens: int
    ) -> PinHandle:
        """Pin ``hold_for_pin``'s entries under ``pin_id`` (an id of the cache's pin table)."""
        self.host.pin(pin_id, entries)
        self.host.release(entries)
        return PinHandle(pin_id, namespace, (), num_tokens, tier=HOST)

    def unpin(self, pin_id: int, tick: int) -> bool:
        """Release a host pin; False when ``pin_id`` is not one (a device pin)."""
        return self.host.unpin(pin_id, tick)

    # ---------------------------------------------------------------- transfers

    def take(self) -> TransferPlan:
        """The copies planned since the last call, in order."""
        if not self._queue:
            return EMPTY_PLAN
        plan = TransferPlan(tuple(self._queue))
        self._queue.clear()
        return plan

    def finish(self, plan: TransferPlan, elapsed_us: int = 0) -> list[Block]:
        """The runner performed ``plan``: its restored blocks are READY; returned so the cache
        can put the unheld ones among its idle blocks."""
        self.restore_us += elapsed_us
        done: list[Block] = []
        for t in plan.transfers:
            if t.direction is not Direction.IN:
                continue
            block = self._loading.pop(t.block_id)
            block.state = BlockState.READY
            assert block.key is not None
            self._notify(block.key, DEVICE)
            done.append(block)
        return done

    def count_snapshot_restore(self, elapsed_us: int) -> None:
        """A prompt was restored from its disk snapshot (engine/runtime/snapshot_restore.py)."""
        self.snapshot_restores += 1
        self.snapshot_us += elapsed_us

    # ---------------------------------------------------------------- observation

    def stats(self) -> dict[str, int]:
        """The tier fields of ``CacheStats``."""
        host = self.host
        return {
            "host_blocks_total": host.num_blocks,
            "host_blocks_cached": len(host),
            "host_blocks_pinned": host.num_pinned,
            "host_hit_tokens": self.host_hit_tokens,
            "blocks_offloaded": self.blocks_out,
            "blocks_restored": self.blocks_in,
            "bytes_offloaded": self.blocks_out * self.block_bytes,
            "bytes_restored": self.blocks_in * self.block_bytes,
            "transfer_us": self.restore_us,
            "snapshot_restores": self.snapshot_restores,
            "snapshot_restore_us": self.snapshot_us,
        }

    def check_integrity(
        self, device_blocks: Iterable[Block], requests: Iterable[RequestState]
    ) -> None:
        """The host tier's own checks, then the LOADING blocks among ``device_blocks`` (all of
        the device pool) against this tier's records, and no request of ``requests`` past one
        it has not received yet."""
        self.host.check_integrity()
        queued_in = {t.block_id for t in self._queue if t.direction is Direction.IN}
        for block in device_blocks:
            if block.state is BlockState.LOADING:
                assert self._loading.get(block.block_id) is block, (
                    f"{block!r} not tracked as loading"
                )
                assert block.owner is None and block.pin_count == 0, (
                    f"LOADING {block!r} owned/pinned"
                )
                parent = block.parent
                assert parent is None or parent.state in (BlockState.READY, BlockState.LOADING), (
                    f"LOADING {block!r} under {parent!r}"
                )
        for bid, block in self._loading.items():
            assert block.state is BlockState.LOADING, f"{block!r} tracked as loading"
            assert block.block_id == bid
        assert queued_in <= set(self._loading), "a queued copy-in targets a block not LOADING"
        bs = self.block_size
        for seq in requests:
            for block in seq.blocks[: -(-seq.num_computed // bs)]:
                assert block.state is not BlockState.LOADING, (
                    f"{seq.request_id!r} committed tokens of {block!r} before its copy completed"
                )
