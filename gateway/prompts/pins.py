"""Pinned tenant prefixes: each active tenant's system prompt stays in the KV cache.

A pin is the engine's ``PinTicket`` (engine/api.py), taken for the tenant: with worker
processes (gateway/cluster/) the cluster keeps it on the tenant's placement set of workers and
moves it when the placement changes; this manager only decides which prompt version is pinned,
as below.

Per tenant there is one *current* entry (the version traffic uses) and possibly retiring ones::

    start-up:        pin every active tenant, most recently used first (the engine's pin cap
                     refuses the rest: they fall back to normal cache retention)
    prompt change:   build + pin the new version  ->  switch current  ->  old entry retires
                     (built off the event loop: ``offload``, the gateway's tokenize pool; a
                     request meanwhile stays on the current entry, and one that sees a version
                     this replica has not activated starts its activation in the background)
    retiring entry:  unpinned as soon as its last in-flight request ends
    tenant deleted:  current entry retires; its prompt snapshots are removed on every worker

Requests take an entry with ``begin`` and give it back with ``end`` (in ``finally``), so an
entry's ``inflight`` count is exact and a version is never unpinned under a running request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict, TypeVar

import structlog
from sqlalchemy import func, select

from engine.api import EngineClient, PinTicket, PinTier
from engine.errors import EngineError, PinRejected
from gateway.prompts.tenant_prefix import ChatTokenizer, EncodedPrefix, TenantPrefix, encode_prefix
from gateway.prompts.tokenize_pool import INLINE_WORK
from tenants.events import TenantChanged
from tenants.models import ApiKey
from tenants.runtime import TenantRuntime
from tenants.store import TenantStore

log = structlog.get_logger(__name__)
T = TypeVar("T")

# Pin states reported by the admin cache endpoint.
NO_PROMPT = "no_prompt"  # tenant has no system prompt: nothing to pin
PINNING = "pinning"
PINNED = "pinned"
REJECTED = "rejected"  # refused by the engine (pin cap, prompt shorter than a block, ...)
UNPINNED = "unpinned"  # built on the request path, not (yet) pinned


class Offload(Protocol):
    """Where a prefix is built: ``fn()`` in ``tenant``'s turn, off the event loop when ``work``
    (characters) is large (gateway/prompts/tokenize_pool.py's ``TokenizePool.run``)."""

    def __call__(self, tenant: str, work: int, fn: Callable[[], T]) -> Awaitable[T]: ...


async def inline(tenant: str, work: int, fn: Callable[[], T]) -> T:
    """No pool (tests of the manager alone): on the loop."""
    return fn()


@dataclass(eq=False)
class PromptEntry:
    tenant_id: str
    version: int | None
    namespace: str = field(repr=False)  # the tenant's cache salt: never logged or returned
    prefix: TenantPrefix = field(repr=False)
    state: str = UNPINNED
    handle: PinTicket | None = None  # while pinned
    reason: str | None = None
    inflight: int = 0
    retiring: bool = False


@dataclass
class TenantCounters:
    requests: int = 0
    query_tokens: int = 0  # prompt tokens looked up
    hit_tokens: int = 0  # of which served from the prefix cache


class CacheInfo(TypedDict):
    """The body of GET /admin/v1/tenants/{id}/cache (``PinManager.cache_info``)."""

    tenant_id: str
    prompt_version: int | None
    pin_state: str
    pin_reason: str | None
    prefix_tokens: int
    pinned_blocks: int
    pinned_tokens: int
    pin_tier: PinTier | None
    inflight_requests: int
    retiring_versions: list[int | None]
    requests: int
    query_tokens: int
    hit_tokens: int
    hit_rate: float
    pinned_on: list[str] | None
    pin_tiers: dict[str, str] | None


class PinManager:
    def __init__(
        self,
        engine: EngineClient,
        tokenizer: ChatTokenizer,
        store: TenantStore,
        encode: Callable[[TenantRuntime], EncodedPrefix] | None = None,
        offload: Offload = inline,
    ) -> None:
        """``encode``: a tenant's encoded prefix from its runtime (default: its prompt alone;
        the gateway's adds the tenant's tools: gateway/chat/tools/tenant.py); ``offload``:
        where activations run it (the gateway's tokenize pool); the ids are made here, on the
        loop (gateway/prompts/tenant_prefix.py's ``EncodedPrefix`` says why)."""
        self._engine = engine
        self._tokenizer = tokenizer
        self._encode = encode or (lambda rt: encode_prefix(tokenizer, rt.prompt_text))
        self._offload = offload
        self._store = store
        self._current: dict[str, PromptEntry] = {}
        self._retiring: list[PromptEntry] = []
        self._building: dict[str, PromptEntry] = {}  # version being pinned, not yet current
        self._activating: dict[str, Version] = {}  # version being built, then pinned
        self._counters: dict[str, TenantCounters] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[object]] = set()
        self.ready = asyncio.Event()  # set once start-up pinning has finished

    # -- start-up and events ----------------------------------------------------------------
    async def pin_all(self) -> None:
        """Start-up pinning. A failure is logged, never fatal: requests then pin on first use."""
        try:
            runtimes = await self._store.list_active_runtimes()
            for rt in await order_by_recent_use(self._store, runtimes):
                await self.activate(rt)
        except Exception:
            log.exception("startup_pinning_failed")
        finally:
            self.ready.set()

    async def on_event(self, event: TenantChanged) -> None:
        if event.kind not in ("created", "updated", "prompt", "deleted"):
            return  # keys and limits do not change the prefix
        rt = await self._store.get_tenant_runtime(event.tenant_id)
        if rt is None or rt.status != "active":
            cur = self._current.pop(event.tenant_id, None)
            if cur is not None:
                await self._retire(cur)
            if rt is not None and rt.status == "deleted":  # suspended ones keep their snapshot
                await self._forget(rt)
            return
        await self.activate(rt)

    async def _forget(self, rt: TenantRuntime) -> None:
        """A deleted tenant's prompt snapshots are removed on every worker
        (engine/runtime/snapshot.py); a failure is logged: the tenant is deleted either way."""
        try:
            await self._engine.forget_namespace(rt.cache_salt)
        except (OSError, EngineError) as exc:
            log.warning("snapshot_forget_failed", tenant=rt.tenant_id, error=str(exc))

    async def activate(self, rt: TenantRuntime, entry: PromptEntry | None = None) -> PromptEntry:
        """Make ``rt``'s prompt version current: pin it first, then switch, then retire the old.

        ``entry``: the one ``begin`` already built for this version (a tenant's first), so that
        its prompt is tokenized once; else it is built by ``offload``, off the loop. While it is
        being pinned it is listed in ``_building``, and requests arriving meanwhile share it
        instead of building their own.
        """
        tenant = rt.tenant_id
        self._activating[tenant] = _version(rt)  # the newest asked for (begin spawns no more)
        async with self._locks.setdefault(tenant, asyncio.Lock()):
            try:
                cur = self._current.get(tenant)
                if cur is not None and _same(cur, rt):
                    return cur
                if entry is None:
                    entry = await self._built_off_loop(rt)
                self._building[tenant] = entry
                await self._pin(entry)
            finally:
                if self._activating.get(tenant) == _version(rt):
                    del self._activating[tenant]
                if entry is not None and self._building.get(tenant) is entry:
                    del self._building[tenant]
            self._current[rt.tenant_id] = entry
            if cur is not None:
                await self._retire(cur)
            return entry

    def _new_entry(self, rt: TenantRuntime) -> PromptEntry:
        return self._entry(rt, self._encode(rt).prefix())

    async def _built_off_loop(self, rt: TenantRuntime) -> PromptEntry:
        """The entry of ``rt``'s version, its prefix rendered and encoded by ``offload`` (with
        tools always on a thread: rendering them is no measure of characters)."""
        work = len(rt.prompt_text or "") + (INLINE_WORK + 1 if rt.tool_policy.tools else 0)
        encoded = await self._offload(rt.tenant_id, work, lambda: self._encode(rt))
        return self._entry(rt, encoded.prefix())

    @staticmethod
    def _entry(rt: TenantRuntime, prefix: TenantPrefix) -> PromptEntry:
        state = UNPINNED if prefix.ids else NO_PROMPT
        return PromptEntry(rt.tenant_id, rt.prompt_version, rt.cache_salt, prefix, state)

    async def _pin(self, entry: PromptEntry) -> None:
        if not entry.prefix.ids:
            return
        entry.state = PINNING
        try:
            ids = list(entry.prefix.ids)
            entry.handle = await self._engine.pin(entry.tenant_id, entry.namespace, ids)
            entry.state = PINNED
        except PinRejected as exc:
            entry.state, entry.reason = REJECTED, exc.reason or str(exc)
            log.info("prefix_pin_rejected", tenant=entry.tenant_id, reason=entry.reason)

    async def _retire(self, entry: PromptEntry) -> None:
        entry.retiring = True
        if entry.inflight == 0:
            await self._unpin(entry)
        else:
            self._retiring.append(entry)

    async def _unpin(self, entry: PromptEntry) -> None:
        if entry in self._retiring:
            self._retiring.remove(entry)
        if entry.handle is not None:
            handle, entry.handle = entry.handle, None
            await self._engine.unpin(handle)
            entry.state = UNPINNED

    # -- request path ------------------------------------------------------------------------
    def begin(self, rt: TenantRuntime) -> PromptEntry:
        """The entry a request uses; take it before generating, ``end`` it in ``finally``.

        A version this replica has not activated yet (missed event, first request of a tenant)
        is activated in the background. Until it is pinned, traffic stays on the current entry
        (so the new prefix is built off the loop, by the activation); a tenant without one is
        served the entry being pinned (built here once, unpinned until its pin lands).
        """
        cur = self._current.get(rt.tenant_id)
        if cur is None:
            cur = self._first_entry(rt)
        elif not _same(cur, rt):
            self._activate_in_background(rt)
        cur.inflight += 1
        return cur

    def _first_entry(self, rt: TenantRuntime) -> PromptEntry:
        pending = self._building.get(rt.tenant_id)
        if pending is None or not _same(pending, rt):
            pending = self._new_entry(rt)
            lock = self._locks.get(rt.tenant_id)
            if lock is None or not lock.locked():
                self._building[rt.tenant_id] = pending
                self.spawn(self.activate(rt, pending))
        return pending

    def _activate_in_background(self, rt: TenantRuntime) -> None:
        pending = self._building.get(rt.tenant_id)
        if pending is not None and _same(pending, rt):
            return  # being pinned
        if self._activating.get(rt.tenant_id) != _version(rt):
            self._activating[rt.tenant_id] = _version(rt)
            self.spawn(self._activate_logged(rt))

    async def _activate_logged(self, rt: TenantRuntime) -> None:
        """A background activation; a failure (the tokenize pool full, the engine away) is
        logged, and the tenant's next request tries again."""
        try:
            await self.activate(rt)
        except Exception as exc:
            log.warning("prefix_activation_failed", tenant=rt.tenant_id, error=str(exc))

    async def end(self, entry: PromptEntry, prompt_tokens: int, cached_tokens: int) -> None:
        entry.inflight -= 1
        assert entry.inflight >= 0, f"inflight below zero for tenant {entry.tenant_id}"
        counters = self._counters.setdefault(entry.tenant_id, TenantCounters())
        counters.requests += 1
        counters.query_tokens += prompt_tokens
        counters.hit_tokens += cached_tokens
        if entry.retiring and entry.inflight == 0:
            await self._unpin(entry)

    def spawn(self, coro: Coroutine[Any, Any, object]) -> None:
        """Run ``coro`` in the background; cancelled by ``close``."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- reporting ---------------------------------------------------------------------------
    def current(self, tenant_id: str) -> PromptEntry | None:
        return self._current.get(tenant_id)

    def cache_info(self, tenant_id: str) -> CacheInfo:
        """What GET /admin/v1/tenants/{id}/cache reports (never the salt or prompt text)."""
        cur = self._current.get(tenant_id)
        counters = self._counters.get(tenant_id, TenantCounters())
        handle = cur.handle if cur is not None else None
        pin = self._engine.pin_status(handle)
        holders = pin.holders
        return {
            "tenant_id": tenant_id,
            "prompt_version": cur.version if cur else None,
            "pin_state": cur.state if cur else UNPINNED,
            "pin_reason": cur.reason if cur else None,
            "prefix_tokens": len(cur.prefix.ids) if cur else 0,
            "pinned_blocks": pin.blocks,
            "pinned_tokens": pin.tokens,
            # where the pinned prompt lives: "device", or "host" (beyond the device pin cap);
            # in a cluster "mixed" when the workers differ (per worker: pin_tiers)
            "pin_tier": pin.tier,
            "inflight_requests": cur.inflight if cur else 0,
            "retiring_versions": [e.version for e in self._retiring if e.tenant_id == tenant_id],
            "requests": counters.requests,
            "query_tokens": counters.query_tokens,
            "hit_tokens": counters.hit_tokens,
            "hit_rate": counters.hit_tokens / counters.query_tokens if counters.query_tokens else 0,
            # workers holding the pin, and each one's tier (None for an in-process engine)
            "pinned_on": sorted(holders) if holders is not None else None,
            "pin_tiers": holders,
        }

    def check_integrity(self) -> None:
        for tenant_id, entry in self._current.items():
            assert entry.tenant_id == tenant_id and not entry.retiring, f"bad current {tenant_id}"
            assert entry.inflight >= 0, f"negative inflight {tenant_id}"
            assert (entry.state == PINNED) == (entry.handle is not None), f"pin state {tenant_id}"
        for entry in self._retiring:
            assert entry.retiring and entry.inflight > 0, f"idle retiring {entry.tenant_id}"

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


Version = tuple[int | None, str]  # a prompt version and the cache salt it is pinned under


def _version(rt: TenantRuntime) -> Version:
    return rt.prompt_version, rt.cache_salt


def _same(entry: PromptEntry, rt: TenantRuntime) -> bool:
    return (entry.version, entry.namespace) == _version(rt)


async def order_by_recent_use(
    store: TenantStore, runtimes: Sequence[TenantRuntime]
) -> list[TenantRuntime]:
    """Most recently used first (by their keys' last use); never-used tenants last, by id."""
    async with store.sessions() as session:
        rows = await session.execute(
            select(ApiKey.tenant_id, func.max(ApiKey.last_used_at)).group_by(ApiKey.tenant_id)
        )
        last_used = {tenant_id: at for tenant_id, at in rows if at is not None}
    used = sorted(
        (rt for rt in runtimes if rt.tenant_id in last_used),
        key=lambda rt: last_used[rt.tenant_id],
        reverse=True,
    )
    return used + [rt for rt in runtimes if rt.tenant_id not in last_used]
