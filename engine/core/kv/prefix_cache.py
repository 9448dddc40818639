"""PrefixCache: paged KV blocks shared by content key, with early reuse of PENDING blocks.

Life of a keyed block::

    allocate (full, key free)      commit covers it           last holder frees it
    EMPTY ----------------> PENDING ----------------> READY -----------------------> idle
      ^      owner computes  |  owner freed first:      (shared,    (reclaimable; leaf-first
      |                      |  heir = earliest other   ref >= 1)    eviction by priority, LRU)
      +---- dropped ---------+  holder (Handoff), or dropped when nobody else holds it
      +---- evicted --------------------------------------------------------------- idle

Host tier (``Tiering``, engine/core/kv/tiering.py): evicted READY blocks of high enough priority are
copied to host memory; lookups continue from the device chain into host entries, restored into
LOADING device blocks; pins beyond the device pin cap live in the host tier.

Keys (engine/core/kv/hashing.py) chain from the namespace root; a request admitted with a
``CacheScope`` keys its blocks past the scope's shared tokens privately, so it matches the
namespace's shared prefix and its own scope's blocks only.

Invariants (``check_integrity``): ref_count == number of requests whose table holds the block;
a PENDING block's owner is alive and holds it; a READY block's parent is READY; a holder of a
block holds its whole chain; idle blocks are READY; EMPTY blocks with ref 0 are in the free deque;
every request's keys are the key rule applied to its tokens, namespace and scope.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from engine.core.kv.block import Block, BlockState
from engine.core.kv.handoff import inherit, pick_heir
from engine.core.kv.hashing import CacheScope
from engine.core.kv.host_tier import HostEntry
from engine.core.kv.index import KeyIndex, NullIndex
from engine.core.kv.integrity import check_integrity
from engine.core.kv.pins import PinTable, resolve_pin
from engine.core.kv.pool import BlockPool
from engine.core.kv.request import RequestState
from engine.core.kv.tiering import Tiering
from engine.core.kv.transfers import TransferPlan
from engine.core.kv.types import (
    DEFAULT_PRIORITY,
    Allocation,
    CacheListener,
    CacheStats,
    Handoff,
    PinFailure,
    PinHandle,
    PrefixMatch,
    PriorityRange,
)


class _Refused(NamedTuple):
    request_id: str
    namespace: str
    scope: CacheScope | None
    tokens: list[int]
    keys: list[bytes | None]


PENDING = BlockState.PENDING
READY = BlockState.READY
LOADING = BlockState.LOADING
COPY_OWNER = "__host-copy__"  # PrefixMatch.owners entry of a LOADING block
HOST_THRESHOLD = 20  # default: prompt blocks (35) are offloaded, decode blocks (10) dropped


class PrefixCache:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_reuse: bool = True,
        pin_cap_fraction: float = 0.5,
        default_priority: int = DEFAULT_PRIORITY,
        listener: CacheListener | None = None,
        host_blocks: int = 0,
        host_threshold: int = HOST_THRESHOLD,
        block_bytes: int = 0,
    ) -> None:
        if block_size < 1 or block_size > 64 or block_size & (block_size - 1):
            raise ValueError(f"block_size must be a power of two in 1..64, got {block_size}")
        PriorityRange(0, None, default_priority).check()
        self.block_size = block_size
        self.default_priority = default_priority
        self.listener = listener
        self.pool = BlockPool(num_blocks)
        self.index: KeyIndex | NullIndex = KeyIndex() if enable_reuse else NullIndex()
        self.pins = PinTable(int(pin_cap_fraction * num_blocks))
        self.requests: dict[str, RequestState] = {}
        self.tiers = Tiering(
            host_blocks, host_threshold, block_size, block_bytes=block_bytes, listener=listener
        )
        self._tick = 0  # logical clock: a block's last_access is the tick it was last released
        self._admitted = 0
        self._num_pending = 0
        self._num_in_use = 0
        self._query_tokens = 0
        self._hit_tokens = 0
        self._evictions = 0
        # (request id, namespace, scope, prompt copy, keys) of the last refused admission: the
        # scheduler retries the head of its queue every step until blocks free up, same prompt.
        self._refused: _Refused | None = None

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    # ---------------------------------------------------------------- lookup / admission

    def lookup(
        self, namespace: str, token_ids: Sequence[int], scope: CacheScope | None = None
    ) -> PrefixMatch:
        """Longest chain of full cached blocks (READY or PENDING) under ``scope``; pure."""
        cap = max(0, (len(token_ids) - 1) // self.block_size)
        return self._as_match(self.index.match(self._keys(namespace, scope, token_ids, cap)))

    def _keys(
        self, namespace: str, scope: CacheScope | None, token_ids: Sequence[int], last: int
    ) -> list[bytes | None]:
        """Keys of full blocks 0..last-1: the one key rule of lookups, admissions and checks."""
        root = self.index.root(namespace)
        return self.index.keys(root, token_ids, self.block_size, 0, last, scope)

    def _as_match(self, blocks: list[Block]) -> PrefixMatch:
        return PrefixMatch(
            tuple([b.block_id for b in blocks]),
            tuple([b.state for b in blocks]),
            tuple([COPY_OWNER if b.state is LOADING else b.owner for b in blocks]),
            self.block_size,
        )

    def allocate(
        self,
        request_id: str,
        namespace: str,
        token_ids: Sequence[int],
        priorities: Sequence[PriorityRange] = (),
        scope: CacheScope | None = None,
    ) -> Allocation | None:
        """Admit (first call) or grow a request's block table to cover ``token_ids``.

        ``scope`` is fixed at admission (later calls may omit it, or must pass the same)."""
        for rng in priorities:
            rng.check()
        seq = self.requests.get(request_id)
        if seq is None:
            return self._admit(request_id, namespace, token_ids, tuple(priorities), scope)
        if seq.namespace != namespace:
            raise ValueError(f"request {request_id!r} belongs to namespace {seq.namespace!r}")
        if scope is not None and scope != seq.scope:
            raise ValueError(f"request {request_id!r} was admitted under another cache scope")
        if len(token_ids) < len(seq.tokens):
            raise ValueError(f"request {request_id!r}: token ids may only grow")
        if priorities:
            seq.priorities = tuple(priorities)
        return self._grow(seq, token_ids)

    def _grow(self, seq: RequestState, token_ids: Sequence[int]) -> Allocation | None:
        bs = self.block_size
        num_new = -(-len(token_ids) // bs) - len(seq.blocks)
        if num_new > self.pool.num_allocatable:
            return None
        seq.tokens.extend(token_ids[len(seq.tokens) :])
        num_full = len(seq.tokens) // bs
        if num_new == 0 and num_full == len(seq.keys) and seq.allocation is not None:
            return seq.allocation  # decode step inside the last block: table unchanged
        self._append_blocks(seq, num_new)
        if num_full > len(seq.keys):
            first = len(seq.keys)
            parent = seq.keys[-1] if seq.keys else self.index.root(seq.namespace)
            seq.keys.extend(self.index.keys(parent, seq.tokens, bs, first, num_full, seq.scope))
            self._register(seq, first, num_full)
        seq.allocation = Allocation(tuple(seq.block_ids), seq.num_cached_tokens, seq.match)
        return seq.allocation

    def _admit(
        self,
        request_id: str,
        namespace: str,
        token_ids: Sequence[int],
        priorities: tuple[PriorityRange, ...],
        scope: CacheScope | None,
    ) -> Allocation | None:
        bs = self.block_size
        if not token_ids:
            raise ValueError(f"request {request_id!r}: empty prompt")
        num_full = len(token_ids) // bs
        keys = self._prompt_keys(request_id, namespace, scope, token_ids)
        cap = (len(token_ids) - 1) // bs
        matched = self.index.match(keys[:cap])
        hosted = self.tiers.continuation(matched, keys, cap)
        num_new = -(-len(token_ids) // bs) - len(matched)
        # matched idle blocks are about to be held: they cannot also be evicted for this request
        if num_new > self.pool.num_allocatable - len(matched):  # exact count only when tight
            taken_idle = len([b for b in matched if b.is_idle])
            if num_new > self.pool.num_allocatable - taken_idle:
                self._refused = _Refused(request_id, namespace, scope, list(token_ids), keys)
                return None
        self._refused = None
        self._admitted += 1
        self.tiers.hold(hosted)  # evictions below may offload: keep these entries
        seq = RequestState(
            request_id, namespace, self._admitted, self._as_match([]), priorities, scope
        )
        self.requests[request_id] = seq
        seq.tokens.extend(token_ids)
        seq.keys = keys
        self._attach(seq, matched)
        seq.num_attached = len(matched) + len(hosted)
        self._append_blocks(seq, num_new)
        self._restore(seq, len(matched), hosted)
        self._register(seq, seq.num_attached, num_full)
        match = seq.match = self._as_match(seq.blocks[: seq.num_attached])
        self._query_tokens += len(token_ids)
        self._hit_tokens += match.num_tokens
        seq.allocation = Allocation(tuple(seq.block_ids), match.num_tokens, match)
        return seq.allocation

    def _prompt_keys(
        self, request_id: str, namespace: str, scope: CacheScope | None, token_ids: Sequence[int]
    ) -> list[bytes | None]:
        """Keys of the prompt's full blocks; a retried refused admission reuses its keys."""
        refused = self._refused
        if (
            refused is not None
            and refused.request_id == request_id
            and refused.namespace == namespace
            and refused.scope == scope
            and refused.tokens == token_ids  # a copy: equal contents, whatever the caller did
        ):
            return refused.keys
        return self._keys(namespace, scope, token_ids, len(token_ids) // self.block_size)

    def _attach(self, seq: RequestState, matched: list[Block]) -> None:
        """Take a reference on each matched block (hot path: one pass, no calls per block)."""
        rid, pool, requests = seq.request_id, self.pool, self.requests
        prio = self.default_priority
        ranges = seq.priorities
        for pos, block in enumerate(matched):
            if block.ref_count == 0:
                self._num_in_use += 1
                if block.pin_count == 0 and block.state is READY:  # idle -> held (inlined)
                    pool.num_idle -= 1
                    block.heap_stamp = 0
            block.ref_count += 1
            if ranges:
                prio = seq.block_priority(pos, self.block_size, self.default_priority)
            if prio > block.priority:  # a shared block keeps the max priority seen
                block.priority = prio
            owner = block.owner
            if owner is not None and owner != rid:
                seq.owners.add(owner)
                requests[owner].dependents[rid] = None
        seq.blocks.extend(matched)
        seq.block_ids.extend([b.block_id for b in matched])

    def _append_blocks(self, seq: RequestState, num_new: int) -> None:
        pop_free = self.pool.free.popleft
        free = self.pool.free
        blocks, ids = seq.blocks, seq.block_ids
        prio = self.default_priority
        for _ in range(num_new):
            block = pop_free() if free else self._evict_one()
            assert block is not None, "allocatable count out of sync with the pool"
            block.ref_count = 1
            block.priority = (
                seq.block_priority(len(blocks), self.block_size, prio) if seq.priorities else prio
            )
            blocks.append(block)
            ids.append(block.block_id)
        self._num_in_use += num_new

    def _register(self, seq: RequestState, first: int, last: int) -> None:
        """Register full blocks first..last-1 PENDING under their keys where possible."""
        blocks, keys, add = seq.blocks, seq.keys, self.index.add
        for pos in range(first, last):
            block = blocks[pos]
            parent = blocks[pos - 1] if pos else None
            if parent is not None and parent.key is None:
                return  # a private block ends the registrable chain of this request
            if not add(keys[pos], block):
                return
            block.key = keys[pos]
            block.state = PENDING
            block.owner = seq.request_id
            block.pos = pos
            block.parent = parent
            if parent is not None:
                parent.children.add(block)
            seq.owned.append(pos)
            self._num_pending += 1

    def _restore(self, seq: RequestState, first: int, entries: list[HostEntry]) -> None:
        """Blocks first.. of ``seq`` (fresh) take the keys of the held host ``entries``: linked
        into the chain LOADING, their copies in planned by the tier."""
        for i, entry in enumerate(entries):
            pos = first + i
            block = seq.blocks[pos]
            parent = seq.blocks[pos - 1] if pos else None
            added = self.index.add(entry.key, block)
            assert added, "a host key is also registered on the device"
            block.key = entry.key
            block.state = LOADING
            block.pos = pos
            block.parent = parent
            if parent is not None:
                parent.children.add(block)
        self.tiers.restore(seq.blocks[first : first + len(entries)], entries, self._tick)

    # ---------------------------------------------------------------- progress / early reuse

    def commit(self, request_id: str, num_computed_tokens: int) -> None:
        """K/V of tokens [0, num_computed_tokens) are written: its covered PENDING blocks READY.

        A block whose parent is still PENDING waits: it turns READY when the parent does (so a
        READY block's parent is always READY, whatever order the owners commit in).
        """
        seq = self.requests[request_id]
        seq.num_computed = min(num_computed_tokens, len(seq.tokens))
        bs, owned, blocks = self.block_size, seq.owned, seq.blocks
        while seq.owned_pos < len(owned):
            pos = owned[seq.owned_pos]
            block = blocks[pos]
            if block.state is PENDING and block.owner == request_id:
                if (pos + 1) * bs > seq.num_computed:
                    break
                if block.parent is not None and block.parent.state is not READY:
                    break
                self._promote(block)
            seq.owned_pos += 1

    def _promote(self, first: Block) -> None:
        """``first`` becomes READY, then any PENDING descendants their owners already computed."""
        stack = [first]
        bs, requests, listener = self.block_size, self.requests, self.listener
        while stack:
            block = stack.pop()
            assert block.owner is not None and block.key is not None, f"{block!r} is not PENDING"
            owner = requests[block.owner]
            block.state = READY
            block.owner = None
            self._num_pending -= 1
            if listener is not None:
                parent_key = block.parent.key if block.parent is not None else None
                start = block.pos * bs
                tokens = tuple(owner.tokens[start : start + bs])
                listener.on_stored(owner.namespace, block.key, parent_key, tokens)
            for child in block.children:
                if child.state is PENDING:
                    assert child.owner is not None, f"PENDING {child!r} has no owner"
                    child_owner = requests[child.owner]
                    if child_owner.num_computed >= (child.pos + 1) * bs:
                        stack.append(child)

    def pending_deps(self, request_id: str) -> dict[str, int]:
        """Owner id -> token end of the last attached block that owner has not committed."""
        seq = self.requests[request_id]
        blocks, end = seq.blocks, seq.num_attached
        pos = seq.ready_upto
        while pos < end and blocks[pos].state is READY:
            pos += 1
        seq.ready_upto = pos
        deps: dict[str, int] = {}
        bs = self.block_size
        for i in range(pos, end):
            owner = blocks[i].owner
            if owner is not None and owner != request_id:
                deps[owner] = (i + 1) * bs
        return deps

    # ---------------------------------------------------------------- release

    def free(self, request_id: str) -> list[Handoff]:
        """Release a finished, aborted or preempted request (unknown ids: no-op)."""
        seq = self.requests.pop(request_id, None)
        if seq is None:
            return []
        self._tick += 1
        handed: dict[str, int] = {}
        blocks = seq.blocks
        for pos in range(len(blocks) - 1, -1, -1):  # tail first: children before parents
            block = blocks[pos]
            block.ref_count -= 1
            if block.state is PENDING and block.owner == request_id:
                if block.ref_count > 0:
                    heir = pick_heir(self.requests, seq, block)
                    block.owner = heir.request_id
                    handed[heir.request_id] = pos * self.block_size
                else:
                    self._num_in_use -= 1
                    self._drop(block)
            elif block.ref_count == 0:
                self._num_in_use -= 1
                if block.key is None:
                    self.pool.push_free(block)
                elif block.pin_count == 0 and block.state is READY:  # LOADING: when copied
                    block.last_access = self._tick
                    self.pool.mark_idle(block)
        for owner_id in seq.owners:
            owner = self.requests.get(owner_id)
            if owner is not None:
                owner.dependents.pop(request_id, None)
        for heir_id, from_token in handed.items():
            inherit(self.requests, self.requests[heir_id], seq, from_token)
        return [Handoff(heir_id, from_token) for heir_id, from_token in handed.items()]

    def _drop(self, block: Block) -> None:
        """A PENDING block nobody holds any more: unregister it and return it to the free deque."""
        assert not block.children, f"dropping {block!r} with cached children"
        self._num_pending -= 1
        self._unlink(block)
        self.pool.push_free(block)

    def _unlink(self, block: Block) -> None:
        assert block.key is not None, f"unlinking unkeyed {block!r}"
        self.index.remove(block.key)
        parent = block.parent
        if parent is not None:
            parent.children.discard(block)
            if not parent.children and parent.is_idle:
                self.pool.push_leaf(parent)
        block.reset()

    # ---------------------------------------------------------------- eviction

    def _evict_one(self) -> Block | None:
        block = self.pool.pop_leaf()
        if block is None:
            return None
        key = block.key
        assert key is not None, f"evicting unkeyed {block!r}"  # idle leaves are keyed
        self.tiers.offload(block, self._tick)
        self._unlink(block)
        self._evictions += 1
        if self.listener is not None:
            self.listener.on_removed(key)
        return block

    def evict(self, n: int) -> int:
        """Evict up to ``n`` idle blocks (leaf first, lowest priority, then LRU); returns count."""
        count = 0
        while count < n:
            block = self._evict_one()
            if block is None:
                break
            self.pool.push_free(block)
            count += 1
        return count

    # ---------------------------------------------------------------- pins

    def pin(self, namespace: str, token_ids: Sequence[int]) -> PinHandle | PinFailure:
        """Keep the full blocks of ``token_ids`` (all READY) resident until ``unpin``."""
        found = resolve_pin(self.index, namespace, token_ids, self.block_size)
        if isinstance(found, PinFailure):
            return found
        num_tokens = len(found) * self.block_size
        result = self.pins.pin(namespace, found, num_tokens, self.pool)
        if isinstance(result, PinFailure) and result.num_new_blocks:  # beyond the device cap
            entries = self.tiers.hold_for_pin(found, result, self._tick)
            if isinstance(entries, PinFailure):
                return entries
            return self.tiers.pin(self.pins.new_id(), namespace, entries, num_tokens)
        return result

    def unpin(self, handle: PinHandle) -> None:
        """Release a pin (idempotent); its blocks fall back to priority/LRU retention."""
        self._tick += 1
        if not self.tiers.unpin(handle.pin_id, self._tick):
            self.pins.unpin(handle, self.pool, self._tick)

    # ---------------------------------------------------------------- tier transfers

    def take_transfers(self) -> TransferPlan:
        """Copies planned since the last call, in order; the runner does them before the step's
        forward, then the engine calls ``finish_transfers``."""
        return self.tiers.take()

    def finish_transfers(self, plan: TransferPlan, elapsed_us: int = 0) -> None:
        """``plan`` was performed: its restored blocks are READY (idle when unheld)."""
        for block in self.tiers.finish(plan, elapsed_us):
            if block.ref_count == 0 and block.pin_count == 0:
                block.last_access = self._tick
                self.pool.mark_idle(block)

    def run_transfers(self, copy: Callable[[TransferPlan], int]) -> None:
        """Take the planned copies, have ``copy`` perform them (it returns the microseconds it
        took: the runner's ``transfer``), and finish them; nothing when none are planned."""
        plan = self.take_transfers()
        if not plan.is_empty:
            self.finish_transfers(plan, copy(plan))

    # ---------------------------------------------------------------- observation

    def stats(self) -> CacheStats:
        return CacheStats(
            blocks_total=self.pool.num_blocks,
            blocks_free=self.pool.num_allocatable,
            blocks_cached=len(self.index) - self._num_pending,
            blocks_in_use=self._num_in_use,
            blocks_pinned=self.pins.num_pinned,
            blocks_pending=self._num_pending,
            query_tokens=self._query_tokens,
            hit_tokens=self._hit_tokens,
            evictions=self._evictions,
            **self.tiers.stats(),
        )

    def check_integrity(self) -> None:
        check_integrity(self)
