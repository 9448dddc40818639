"""The host tier: a second pool of KV block slots in host memory, keyed like the device pool.

    device pool (engine/core/kv/pool.py)                  host tier (this module)
    READY idle leaf evicted, priority >= threshold  ---- copy out ---->  HostEntry(key, slot)
    LOADING device block (fresh)                    <--- copy in -----  HostEntry (kept)

A key may live in both tiers: a restored entry keeps its host copy, so evicting its device block
again costs no copy. Entries are reclaimed leaf-first (no host child), lowest priority, then least
recently used; never while pinned or held (``busy``: a cache operation in progress relies on it).
Host pins hold entries until unpinned: the pins beyond the device pin cap live here. A tier of 0
blocks is the disabled tier (matches nothing, stores nothing), so the cache never tests a flag.

This module is bookkeeping only: which slot holds which key. The bytes are moved by the runner
(engine/runtime/tiers/host_pool.py) following the cache's transfer plan
(engine/core/kv/transfers.py).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence


class HostEntry:
    __slots__ = (
        "busy",
        "children",
        "heap_stamp",
        "key",
        "last_access",
        "parent",
        "pin_count",
        "priority",
        "slot",
    )

    def __init__(
        self, key: bytes, parent: bytes | None, slot: int, priority: int, tick: int
    ) -> None:
        self.key = key
        self.parent = parent  # key of the block before it in its chain (None at the root)
        self.slot = slot
        self.priority = priority
        self.last_access = tick
        self.pin_count = 0
        self.busy = 0
        self.children = 0  # host entries whose parent is this one
        self.heap_stamp = 0  # live reclaim-heap entry; 0 = not reclaimable now

    @property
    def reclaimable(self) -> bool:
        return self.pin_count == 0 and self.busy == 0 and self.children == 0

    def __repr__(self) -> str:
        return (
            f"HostEntry({self.key.hex()[:8]}, slot={self.slot}, pin={self.pin_count}, "
            f"busy={self.busy}, children={self.children})"
        )


class HostTier:
    def __init__(
        self,
        num_blocks: int,
        threshold: int,
        on_drop: Callable[[bytes], None] | None = None,
    ) -> None:
        if num_blocks < 0:
            raise ValueError(f"host tier size must be >= 0 blocks, got {num_blocks}")
        self.num_blocks = num_blocks
        self.threshold = threshold  # device blocks evicted with priority >= threshold come here
        self.on_drop = on_drop
        self.entries: dict[bytes, HostEntry] = {}
        self.free_slots: deque[int] = deque(range(num_blocks))
        self.handles: dict[int, tuple[HostEntry, ...]] = {}  # host pins
        self.num_pinned = 0  # entries with pin_count > 0
        self.num_reclaimed = 0
        # parent key -> entries naming it as parent; device eviction is leaf first, so a child
        # often comes here before its parent does
        self._kids: dict[bytes, int] = {}
        self._heap: list[tuple[int, int, int, HostEntry]] = []
        self._stamp = 0

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, key: bytes | None) -> HostEntry | None:
        return self.entries.get(key) if key is not None else None

    def match(self, keys: Sequence[bytes | None]) -> list[HostEntry]:
        """Entries of the longest run of ``keys`` held here, from the start of ``keys``."""
        out: list[HostEntry] = []
        for key in keys:
            entry = self.get(key)
            if entry is None:
                break
            out.append(entry)
        return out

    def wants(self, priority: int) -> bool:
        return priority >= self.threshold

    def store(self, key: bytes, parent: bytes | None, priority: int, tick: int) -> HostEntry | None:
        """A new entry for ``key`` (not held yet) in a free or reclaimed slot; None when full."""
        assert key not in self.entries, "key already in the host tier"
        slot = self.free_slots.popleft() if self.free_slots else self._reclaim()
        if slot is None:
            return None
        entry = HostEntry(key, parent, slot, priority, tick)
        entry.children = self._kids.get(key, 0)
        self.entries[key] = entry
        if parent is not None:
            self._kids[parent] = self._kids.get(parent, 0) + 1
            up = self.entries.get(parent)
            if up is not None:
                up.children += 1
                self._update(up)
        self._update(entry)
        return entry

    def touch(self, entry: HostEntry, priority: int, tick: int) -> None:
        entry.last_access = tick
        entry.priority = max(entry.priority, priority)
        if entry.heap_stamp:
            entry.heap_stamp = 0  # re-queued with its new rank
            self._update(entry)

    def hold(self, entries: Sequence[HostEntry]) -> None:
        for entry in entries:
            entry.busy += 1
            self._update(entry)

    def release(self, entries: Sequence[HostEntry]) -> None:
        for entry in entries:
            entry.busy -= 1
            self._update(entry)

    # ---------------------------------------------------------------- pins

    def pin(self, pin_id: int, entries: Sequence[HostEntry]) -> None:
        for entry in entries:
            if entry.pin_count == 0:
                self.num_pinned += 1
            entry.pin_count += 1
            self._update(entry)
        self.handles[pin_id] = tuple(entries)

    def unpin(self, pin_id: int, tick: int) -> bool:
        """Release a host pin; False when ``pin_id`` is not one."""
        entries = self.handles.pop(pin_id, None)
        if entries is None:
            return False
        for entry in entries:
            entry.pin_count -= 1
            if entry.pin_count == 0:
                self.num_pinned -= 1
                entry.last_access = tick
            self._update(entry)
        return True

    # ---------------------------------------------------------------- reclaim

    def _update(self, entry: HostEntry) -> None:
        """Keep the invariant: in the reclaim heap (live stamp) iff reclaimable."""
        if not entry.reclaimable:
            entry.heap_stamp = 0
        elif entry.heap_stamp == 0:
            self._stamp += 1
            entry.heap_stamp = self._stamp
            item = (entry.priority, entry.last_access, self._stamp, entry)
            heapq.heappush(self._heap, item)
            if len(self._heap) > 2 * len(self.entries) + 1024:
                self._heap = [e for e in self._heap if e[3].heap_stamp == e[2]]
                heapq.heapify(self._heap)

    def _reclaim(self) -> int | None:
        heap = self._heap
        while heap:
            _, _, stamp, entry = heapq.heappop(heap)
            if entry.heap_stamp == stamp and self.entries.get(entry.key) is entry:
                self._remove(entry)
                return entry.slot
        return None

    def _remove(self, entry: HostEntry) -> None:
        del self.entries[entry.key]
        entry.heap_stamp = 0
        self.num_reclaimed += 1
        parent = entry.parent
        if parent is not None:
            left = self._kids[parent] - 1
            if left:
                self._kids[parent] = left
            else:
                del self._kids[parent]
            up = self.entries.get(parent)
            if up is not None:
                up.children -= 1
                self._update(up)
        if self.on_drop is not None:
            self.on_drop(entry.key)

    def live_heap(self) -> list[HostEntry]:
        return [e for _, _, stamp, e in self._heap if e.heap_stamp == stamp]

    def check_integrity(self) -> None:
        slots = [e.slot for e in self.entries.values()]
        assert len(set(slots)) == len(slots), "two host entries share a slot"
        assert not set(slots) & set(self.free_slots), "a host slot is both used and free"
        assert len(slots) + len(self.free_slots) == self.num_blocks, "host slots lost"
        children: dict[bytes, int] = {}
        for entry in self.entries.values():
            if entry.parent is not None and entry.parent in self.entries:
                children[entry.parent] = children.get(entry.parent, 0) + 1
        pins: dict[bytes, int] = {}
        for entries in self.handles.values():
            for entry in entries:
                assert self.entries.get(entry.key) is entry, f"host pin holds a gone {entry!r}"
                pins[entry.key] = pins.get(entry.key, 0) + 1
        for key, entry in self.entries.items():
            assert entry.key == key, f"host index key {key.hex()} maps to {entry!r}"
            assert entry.children == children.get(key, 0), f"{entry!r}: child count"
            assert entry.pin_count == pins.get(key, 0), f"{entry!r}: pin count"
            assert entry.busy == 0, f"{entry!r} held outside a cache operation"
            assert bool(entry.heap_stamp) == entry.reclaimable, f"{entry!r}: heap membership"
        assert self.num_pinned == len(pins), f"host num_pinned {self.num_pinned} != {len(pins)}"
        live = self.live_heap()
        assert len({id(e) for e in live}) == len(live), "a host entry has two live heap entries"
