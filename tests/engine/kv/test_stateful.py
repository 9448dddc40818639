"""Random interleavings of the scheduler-facing API against a reference model.

The model keeps one entry per cached full-block prefix (keyed like the cache, per namespace) with
its state, owner, holders and pins, and predicts every result: hits, PENDING owners, handoffs,
allocation failures, pin outcomes. Evictions are observed through the listener and checked
(leaf first, never pinned or held) as they happen.

Requests may carry a cache scope (an end user): the model keys their blocks by its own spelling of
the rule (shared blocks under the namespace root, the rest re-rooted with the salt), so requests of
other scopes match only the shared blocks, early reuse included.

The host tier is part of the model: offloads and host reclaims are observed through the
listener's ``on_tier`` (a reclaimed entry is never pinned or held by an admission in progress);
lookups continue from a READY device chain into host entries, whose restored device blocks are
LOADING until the copy step (which may abort a request first); host pins hold their entries.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine.core.kv import BlockState, CacheScope, PinHandle, PrefixCache
from engine.core.kv.hashing import block_keys, root_key, scope_parent
from engine.core.kv.prefix_cache import COPY_OWNER
from engine.core.kv.transfers import Direction

READY = BlockState.READY

NUM_BLOCKS = 20
HOST_BLOCKS = 6
NAMESPACES = ("a", "b", "c")
# shared "system prompts" (repeats weight the draw) so that prefixes collide often
BASES = ((1, 2, 3, 4, 5, 6, 7, 8),) * 3 + ((1, 2, 3, 4, 9, 9), (5,), ())
NS_DRAW = st.sampled_from(("a", "a", "a", "b", "c"))
# end users: the shared part ends inside the bases' common "1 2 3 4" or at the 8-token prompt
SCOPES = (None, None, *(CacheScope(u, n) for u in ("u1", "u2") for n in (3, 4, 8)))
SCOPE_DRAW = st.sampled_from(SCOPES)


@dataclass
class Entry:
    ns: str
    state: BlockState
    owner: str | None
    pos: int
    parent: bytes | None
    holders: set[str] = field(default_factory=set)
    pins: int = 0


@dataclass
class Req:
    ns: str
    scope: CacheScope | None
    admit: int
    tokens: list[int]
    held: list[bytes] = field(default_factory=list)  # keys of the entries it holds, by position
    computed: int = 0


class PrefixCacheMachine(RuleBasedStateMachine):
    @initialize(bs=st.sampled_from([1, 2, 4]))
    def setup(self, bs: int) -> None:
        self.bs = bs
        self.cache = PrefixCache(
            NUM_BLOCKS, bs, listener=self, host_blocks=HOST_BLOCKS, pin_cap_fraction=0.25
        )
        self.host: dict[bytes, int] = {}  # key -> host pin count
        self.host_protected: set[bytes] = set()
        self.loading_taken: set[bytes] = set()
        self.entries: dict[bytes, Entry] = {}
        self.reqs: dict[str, Req] = {}
        self.pins: dict[int, tuple[PinHandle, list[bytes]]] = {}  # device and host pins
        self.next_id = 0
        self.stored: list[bytes] = []
        self.protected: set[bytes] = set()  # matched by the allocation in progress
        self.evicted: list[bytes] = []
        self.seen: list[tuple[str, tuple[int, ...]]] = []  # admitted prompts, for pins

    # ------------------------------------------------------------------ listener

    def on_stored(self, namespace: str, key: bytes, parent_key: bytes | None, token_ids) -> None:
        entry = self.entries[key]
        assert entry.ns == namespace and entry.state is BlockState.PENDING
        assert len(token_ids) == self.bs
        self.stored.append(key)

    def on_removed(self, key: bytes) -> None:
        entry = self.entries.pop(key)
        assert entry.state is BlockState.READY, "evicted a PENDING block"
        assert entry.pins == 0, "evicted a pinned block"
        assert not entry.holders and key not in self.protected, "evicted a held block"
        assert not any(e.parent == key for e in self.entries.values()), "evicted a non-leaf"
        self.evicted.append(key)

    def on_tier(self, key: bytes, tier: str | None) -> None:
        if tier == "host":
            assert key not in self.host, "offloaded a key the host already holds"
            entry = self.entries.get(key)
            assert entry is not None and entry.state is BlockState.READY, "offloaded non-READY"
            self.host[key] = 0
        elif tier is None:
            assert self.host.pop(key) == 0, "reclaimed a host-pinned entry"
            assert key not in self.host_protected, "reclaimed a host entry being restored"
        else:
            entry = self.entries[key]
            assert entry.state is BlockState.LOADING, "restore completed for a non-LOADING block"
            assert key in self.loading_taken, "restore completed before its copy was planned"

    # ------------------------------------------------------------------ model helpers

    def _keys(self, ns: str, scope: CacheScope | None, tokens: list[int], last: int) -> list[bytes]:
        """Keys of blocks 0..last-1, from scratch (the rule, spelled with unscoped chains)."""
        root = root_key(ns)
        if scope is None:
            return block_keys(root, tokens, self.bs, 0, last)
        split = min(scope.shared_tokens // self.bs, last)
        shared = block_keys(root, tokens, self.bs, 0, split)
        private_root = scope_parent(shared[-1] if shared else root, scope.salt_bytes)
        return shared + block_keys(private_root, tokens, self.bs, split, last)

    def _allocatable(self) -> int:
        private = sum(-(-len(r.tokens) // self.bs) - len(r.held) for r in self.reqs.values())
        held = sum(1 for e in self.entries.values() if e.holders)
        pinned_only = sum(1 for e in self.entries.values() if e.pins and not e.holders)
        loading = sum(
            1 for e in self.entries.values() if e.state is BlockState.LOADING and not e.holders
        )
        return NUM_BLOCKS - private - held - pinned_only - loading

    def _host_run(self, keys: list[bytes], k: int, cap: int) -> int:
        """How many host entries continue a device chain of k blocks (READY at its end)."""
        if k and self.entries[keys[k - 1]].state is not BlockState.READY:
            return 0
        h = 0
        while k + h < cap and keys[k + h] in self.host:
            h += 1
        return h

    def _register(self, rid: str, req: Req, keys: list[bytes], first: int) -> None:
        for pos in range(first, first + len(keys)):
            key = keys[pos - first]
            if len(req.held) != pos or key in self.entries:
                return
            parent = req.held[pos - 1] if pos else None
            self.entries[key] = Entry(req.ns, BlockState.PENDING, rid, pos, parent, {rid})
            req.held.append(key)

    def _promote(self) -> list[bytes]:
        promoted, changed = [], True
        while changed:
            changed = False
            for key, e in self.entries.items():
                if e.state is not BlockState.PENDING:
                    continue
                req = self.reqs[e.owner]  # type: ignore[index]
                parent_ok = (
                    e.pos == 0 or self.entries[req.held[e.pos - 1]].state is BlockState.READY
                )
                if parent_ok and req.computed >= (e.pos + 1) * self.bs:
                    e.state, e.owner, changed = BlockState.READY, None, True
                    promoted.append(key)
        return promoted

    # ------------------------------------------------------------------ rules

    @rule(
        ns=NS_DRAW,
        sc=SCOPE_DRAW,
        base=st.sampled_from(BASES),
        tail=st.lists(st.integers(0, 3), max_size=6),
    )
    def admit(self, ns: str, sc: CacheScope | None, base: tuple[int, ...], tail: list[int]) -> None:
        self._admit(ns, sc, [*base, *tail] or [0])

    @rule(
        data=st.data(),
        same=st.booleans(),
        sc=SCOPE_DRAW,
        tail=st.lists(st.integers(0, 3), max_size=3),
    )
    @precondition(lambda self: self.reqs)
    def admit_follower(self, data, same: bool, sc: CacheScope | None, tail: list[int]) -> None:
        """Early reuse: a request sharing a running request's prompt (maybe still PENDING), of
        the same end user or of another one (who may attach to the shared blocks only)."""
        leader = self.reqs[data.draw(st.sampled_from(sorted(self.reqs)))]
        self._admit(leader.ns, leader.scope if same else sc, [*leader.tokens, *tail])

    @rule(
        ns=NS_DRAW,
        sc=SCOPE_DRAW,
        base=st.sampled_from(BASES),
        tails=st.lists(st.integers(0, 3), max_size=3),
    )
    def burst(
        self, ns: str, sc: CacheScope | None, base: tuple[int, ...], tails: list[int]
    ) -> None:
        """Several requests with one prompt arrive together (cold cache: they attach PENDING)."""
        for tail in (0, *tails):
            self._admit(ns, sc, [*base, tail])

    def _admit(self, ns: str, sc: CacheScope | None, tokens: list[int]) -> None:
        rid = f"r{self.next_id}"
        self.next_id += 1
        n_full = len(tokens) // self.bs
        keys = self._keys(ns, sc, tokens, n_full)
        cap = (len(tokens) - 1) // self.bs
        k = 0
        while k < cap and keys[k] in self.entries:
            k += 1
        h = self._host_run(keys, k, cap)
        matched = [self.entries[key] for key in keys[:k]]
        idle_taken = sum(1 for e in matched if not e.holders and not e.pins and e.state is READY)
        expect_none = -(-len(tokens) // self.bs) - k > self._allocatable() - idle_taken
        self.protected = set(keys[:k])
        self.host_protected = set(keys[k : k + h])
        alloc = self.cache.allocate(rid, ns, tokens, scope=sc)
        self.protected = self.host_protected = set()
        assert (alloc is None) == expect_none
        if alloc is None:
            return
        assert alloc.num_cached_tokens == (k + h) * self.bs, "hits != longest cached prefix"
        loading = (BlockState.LOADING,) * h
        assert alloc.match.states == tuple(e.state for e in matched) + loading
        owners = tuple(COPY_OWNER if e.state is BlockState.LOADING else e.owner for e in matched)
        assert alloc.match.owners == owners + (COPY_OWNER,) * h
        self.seen.append((ns, tuple(tokens)))
        req = self.reqs[rid] = Req(ns, sc, self.next_id, tokens, list(keys[:k]))
        for e in matched:
            e.holders.add(rid)
        for pos in range(k, k + h):
            parent = keys[pos - 1] if pos else None
            self.entries[keys[pos]] = Entry(ns, BlockState.LOADING, None, pos, parent, {rid})
            req.held.append(keys[pos])
        self._register(rid, req, keys[k + h :], k + h)

    @rule(data=st.data(), extra=st.lists(st.integers(0, 3), min_size=1, max_size=3))
    @precondition(lambda self: self.reqs)
    def extend(self, data, extra: list[int]) -> None:
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        req = self.reqs[rid]
        tokens = req.tokens + extra
        new_blocks = -(-len(tokens) // self.bs) - -(-len(req.tokens) // self.bs)
        expect_none = new_blocks > self._allocatable()
        alloc = self.cache.allocate(rid, req.ns, tokens)
        assert (alloc is None) == expect_none
        if alloc is None:
            return
        first, last = len(req.tokens) // self.bs, len(tokens) // self.bs
        req.tokens = tokens
        self._register(rid, req, self._keys(req.ns, req.scope, tokens, last)[first:], first)

    @rule(data=st.data())
    @precondition(lambda self: self.reqs)
    def commit(self, data) -> None:
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        req = self.reqs[rid]
        self._commit(rid, data.draw(st.integers(req.computed, len(req.tokens))))

    def _commit(self, rid: str, n: int) -> None:
        self._copy_step(None)  # the engine runs a step's copies before its forward
        self.stored = []
        self.cache.commit(rid, n)
        self.reqs[rid].computed = n
        assert sorted(self._promote()) == sorted(self.stored)

    @rule(reverse=st.booleans())
    @precondition(lambda self: self.reqs)
    def step(self, reverse: bool) -> None:
        """A scheduler step: every running request computes all its tokens; commits in admission
        order, or reversed (followers report before the owners of the blocks they attached to)."""
        for rid in sorted(self.reqs, key=lambda r: self.reqs[r].admit, reverse=reverse):
            self._commit(rid, len(self.reqs[rid].tokens))
            self.matches_model()

    @rule(data=st.data())
    @precondition(lambda self: self.reqs)
    def free(self, data) -> None:
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        self._free(rid)

    @rule(data=st.data())
    @precondition(lambda self: any(r.computed == 0 for r in self.reqs.values()))
    def abort(self, data) -> None:
        rid = data.draw(st.sampled_from(sorted(r for r, q in self.reqs.items() if not q.computed)))
        self._free(rid)

    @rule(data=st.data())
    @precondition(lambda self: any(e.owner and len(e.holders) > 1 for e in self.entries.values()))
    def abort_owner(self, data) -> None:
        """Abort a request whose PENDING blocks other requests attached to (forces a handoff)."""
        owners = sorted({e.owner for e in self.entries.values() if e.owner and len(e.holders) > 1})
        self._free(data.draw(st.sampled_from(owners)))

    def _free(self, rid: str) -> None:
        req = self.reqs.pop(rid)
        expected: dict[str, int] = {}
        for pos in range(len(req.held) - 1, -1, -1):
            key = req.held[pos]
            e = self.entries[key]
            e.holders.discard(rid)
            if e.state is BlockState.PENDING and e.owner == rid:
                if e.holders:
                    e.owner = min(e.holders, key=lambda h: self.reqs[h].admit)
                    expected[e.owner] = pos * self.bs
                else:
                    del self.entries[key]
        for heir, start in expected.items():
            self.reqs[heir].computed = min(self.reqs[heir].computed, start)
        handoffs = self.cache.free(rid)
        assert {h.request_id: h.from_token for h in handoffs} == expected

    @rule(data=st.data(), n=st.integers(1, 8))
    @precondition(lambda self: self.seen)
    def pin(self, data, n: int) -> None:
        ns, prompt = data.draw(st.sampled_from(self.seen))
        tokens = list(prompt[: n * self.bs])
        n_full = len(tokens) // self.bs
        keys = self._keys(ns, None, tokens, n_full)  # pins: unscoped (the shared part)
        ready = n_full > 0 and all(
            k in self.entries and self.entries[k].state is BlockState.READY for k in keys
        )
        in_cap = False
        if ready:
            pinned = sum(1 for e in self.entries.values() if e.pins)
            new = sum(1 for k in keys if not self.entries[k].pins)
            in_cap = pinned + new <= self.cache.pins.cap_blocks
        missing = sum(1 for k in keys if k not in self.host)
        free_slots = HOST_BLOCKS - len(self.host)
        result = self.cache.pin(ns, tokens)
        if not ready or in_cap:
            assert isinstance(result, PinHandle) == ready, result
            assert not ready or result.tier == "device"
        elif isinstance(result, PinHandle):  # beyond the device cap: pinned in the host tier
            assert result.tier == "host" and not result.block_ids
        else:  # the host tier could not take it
            assert missing > free_slots, result
        if not isinstance(result, PinHandle):
            return
        self.pins[result.pin_id] = (result, keys)
        for k in keys:
            if result.tier == "host":
                assert k in self.host, "host pin without a host entry"
                self.host[k] += 1
            else:
                self.entries[k].pins += 1

    @rule(data=st.data())
    @precondition(lambda self: self.pins)
    def unpin(self, data) -> None:
        pin_id = data.draw(st.sampled_from(sorted(self.pins)))
        handle, keys = self.pins.pop(pin_id)
        self.cache.unpin(handle)
        for k in keys:
            if handle.tier == "host":
                self.host[k] -= 1
            else:
                self.entries[k].pins -= 1

    @rule(n=st.integers(1, 6))
    def evict(self, n: int) -> None:
        count = self.cache.evict(n)
        assert 0 <= count <= n
        if count < n:  # nothing evictable left (a block under a LOADING one stays)
            above_loading: set[bytes] = set()
            for e in self.entries.values():
                parent = e.parent if e.state is BlockState.LOADING else None
                while parent is not None and parent not in above_loading:
                    above_loading.add(parent)
                    parent = self.entries[parent].parent
            assert not any(
                not e.holders and not e.pins and e.state is BlockState.READY
                for k, e in self.entries.items()
                if k not in above_loading
            )

    @rule(ns=NS_DRAW, sc=SCOPE_DRAW, base=st.sampled_from(BASES))
    def lookup(self, ns: str, sc: CacheScope | None, base: tuple[int, ...]) -> None:
        tokens = [*base, 0]
        keys = self._keys(ns, sc, tokens, (len(tokens) - 1) // self.bs)
        k = 0
        while k < len(keys) and keys[k] in self.entries:
            k += 1
        assert self.cache.lookup(ns, tokens, sc).num_tokens == k * self.bs  # lookup: device only

    @rule(
        ns=NS_DRAW,
        sc=SCOPE_DRAW,
        base=st.sampled_from(BASES),
        tail=st.lists(st.integers(0, 3), max_size=4),
    )
    def round_trip(
        self, ns: str, sc: CacheScope | None, base: tuple[int, ...], tail: list[int]
    ) -> None:
        """A prompt is computed, released and evicted (offloaded), then asked for again."""
        tokens = [*base, *tail] or [0]
        rid = f"r{self.next_id}"
        self._admit(ns, sc, tokens)
        if rid not in self.reqs:
            return
        self._commit(rid, len(tokens))
        self._free(rid)
        self.evict(NUM_BLOCKS)
        self._admit(ns, sc, tokens)

    @rule(data=st.data(), abort=st.booleans())
    def copy_step(self, data, abort: bool) -> None:
        """The engine's copy step; ``abort``: a request holding a LOADING block leaves while its
        copy is in flight (between the plan and its completion)."""
        victims = sorted(
            rid
            for rid, r in self.reqs.items()
            if any(self.entries[k].state is BlockState.LOADING for k in r.held)
        )
        self._copy_step(data.draw(st.sampled_from(victims)) if abort and victims else None)

    def _copy_step(self, abort: str | None) -> None:
        plan = self.cache.take_transfers()
        loading = {k for k, e in self.entries.items() if e.state is BlockState.LOADING}
        self.loading_taken = loading
        by_id = {b.block_id: k for k, b in self.cache.index.items()}
        ins = [by_id[t.block_id] for t in plan.transfers if t.direction is Direction.IN]
        assert set(ins) <= loading and len(set(ins)) == len(ins), "copy-in of a non-LOADING block"
        if abort is not None:
            self._free(abort)
            self.matches_model()
        self.cache.finish_transfers(plan)
        for k in loading:
            self.entries[k].state = BlockState.READY
        self.loading_taken = set()

    # ------------------------------------------------------------------ invariants

    @invariant()
    def matches_model(self) -> None:
        if not hasattr(self, "cache"):
            return
        self.cache.check_integrity()
        actual = {k: (b.state, b.owner) for k, b in self.cache.index.items()}
        assert actual == {k: (e.state, e.owner) for k, e in self.entries.items()}
        held = {b.block_id for r in self.cache.requests.values() for b in r.blocks}
        assert not held & {b.block_id for b in self.cache.pool.free}, "block free and held"
        stats = self.cache.stats()
        assert stats.blocks_free == self._allocatable()
        assert stats.blocks_pinned == sum(1 for e in self.entries.values() if e.pins)
        assert set(self.cache.tiers.host.entries) == set(self.host), "host tier != model"
        assert stats.host_blocks_pinned == sum(1 for c in self.host.values() if c)


PrefixCacheMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_prefix_cache_state_machine = PrefixCacheMachine.TestCase
