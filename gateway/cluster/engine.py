"""``ClusterEngine``: the gateway's engine when the engine runs in worker processes.

It is an ``EngineClient`` (engine/api.py), like the in-process ``AsyncEngine``, so views, the
pin manager and telemetry do not care where the engine runs. Behind it::

    health loop (every health_s): resolve KVGATE_WORKERS, poll each worker's load; a worker
        failing DOWN_AFTER_FAILURES checks in a row is taken out, one answering again (or
        restarted: new boot id) is taken in -> placement recomputed, pins reconciled
    KV event stream per healthy worker -> KvIndex (conversation affinity)
    generate: route (gateway/cluster/router.py); a worker that fails before the first output
        is taken out and the request goes to the next one; a stream that breaks after outputs
        were delivered ends with WorkerLost (the client gets an SSE error event)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Sequence
from typing import Any

import aiohttp
import structlog

from engine.api import (
    DEFAULT_OPTIONS,
    CacheScope,
    CacheStats,
    EngineInfo,
    GenerateOptions,
    PinStatus,
    PinTicket,
    request_id_or_new,
)
from engine.errors import EngineClosed, EngineOverloaded, PinRejected
from engine.outputs import RequestOutput
from engine.params import SamplingParams
from engine.remote.client import WorkerClient, WorkerUnavailable
from engine.remote.messages import WireError, WorkerInfo
from engine.remote.replica import ReplicaClient
from engine.text.tokenizer import Tokenizer
from gateway.cluster.discovery import resolve_workers
from gateway.cluster.dispatch import Dispatcher, Entry, Slot, with_room
from gateway.cluster.forget import SnapshotForgets
from gateway.cluster.kvindex import KvIndex
from gateway.cluster.loadstats import LoadStats
from gateway.cluster.members import Member
from gateway.cluster.placer import Placer, TenantPin, placement_key
from gateway.cluster.router import Route, choose

log = structlog.get_logger(__name__)
Connect = Callable[[str, aiohttp.ClientSession, float], ReplicaClient]
# (namespace, cache scope) of a request -> how the replicas' KV events key its blocks
IndexKeys = Callable[[str, CacheScope | None], tuple[str, CacheScope | None]]


def same_keys(namespace: str, scope: CacheScope | None) -> tuple[str, CacheScope | None]:
    """kvgate workers key blocks as the request names them."""
    return namespace, scope


# Least time a health check (and any non-streaming call) may take: a worker whose CPU is
# saturated by prefill answers late, and a slow worker is not a dead one.
HEALTH_TIMEOUT_S = 5.0


class ClusterEngine:
    def __init__(
        self,
        endpoints: Sequence[str],
        token: str,
        *,
        tokenizer: Tokenizer,
        info: WorkerInfo,
        health_s: float = 1.0,
        spill_queue_s: float = 0.5,
        replica_rate: float = 2.0,
        load_stats: LoadStats | None = None,
        on_close: Callable[[], Awaitable[None]] | None = None,
        unix_paths: dict[str, str] | None = None,  # url -> Unix socket (the local worker)
        connect: Connect | None = None,  # url, session, timeout -> its client (vLLM servers)
        index_keys: IndexKeys = same_keys,
        grammars: frozenset[str] | None = None,  # kinds the replicas enforce (None: all)
        dispatch: Dispatcher | None = None,  # admission in front of the workers (no bound)
    ) -> None:
        self._info = EngineInfo(tokenizer, info.max_model_len, info.block_size)
        if grammars is not None:
            self._info = dataclasses.replace(self._info, grammars=grammars)
        self._connect = connect or self._worker_client
        self.backend = "kvgate" if connect is None else "vllm"
        self._index_keys = index_keys
        self.block_size = info.block_size
        self._endpoints = tuple(endpoints)
        self._token = token
        self._health_s = health_s
        self._health_timeout = max(HEALTH_TIMEOUT_S, 2 * health_s)
        self._spill_queue_s = spill_queue_s
        self._stats = load_stats or LoadStats(None, "", 10.0)
        self._on_close = on_close  # e.g. stop the local worker process
        self._unix_paths = dict(unix_paths or {})
        self.members: dict[str, Member] = {}  # by url
        self.placer = Placer(replica_rate)
        self.index = KvIndex()
        self.dispatch = dispatch or Dispatcher()
        self.forgets = SnapshotForgets()
        self._flights: dict[str, Member] = {}  # request id -> worker serving it
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[object]] = set()
        self._streams: dict[str, asyncio.Task[None]] = {}  # url -> KV event task
        self._dirty = asyncio.Event()
        self._demand_shape: dict[str, tuple[int, int]] = {}
        self._started = False
        self._closed = False
        self.retries = 0
        self.failovers = 0

    # ------------------------------------------------------------------ view of the cluster

    @property
    def info(self) -> EngineInfo:
        """The model's, as the first worker that answered told it (gateway/cluster/bootstrap.py)."""
        return self._info

    @property
    def is_running(self) -> bool:
        return self._started and not self._closed and any(self.healthy().values())

    def healthy(self) -> dict[str, Member]:
        """Healthy workers by worker id (one member per id)."""
        out: dict[str, Member] = {}
        for m in self.members.values():
            if m.healthy and m.worker_id not in out:
                out[m.worker_id] = m
        return out

    def cache_stats(self) -> CacheStats:
        """Sum over healthy workers, as of their last load poll."""
        stats = [m.load.stats for m in self.healthy().values() if m.load is not None]
        fields = CacheStats.__dataclass_fields__
        return CacheStats(**{f: sum(getattr(s, f) for s in stats) for f in fields})

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._closed:
            raise EngineClosed("the cluster client was shut down")
        if self._started:
            return
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=None, enable_cleanup_closed=True)
        )
        self._started = True
        await self._check_all()
        self._spawn(self._health_loop())
        self._spawn(self._reconcile_loop())
        self._dirty.set()

    async def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for task in [*self._tasks, *self._streams.values()]:
            task.cancel()
        for task in [*self._tasks, *self._streams.values()]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.placer.close()
        for m in self.members.values():
            await m.client.close()
        if self._session is not None:
            await self._session.close()
        await self._stats.close()
        if self._on_close is not None:
            await self._on_close()

    def _spawn(self, coro: Coroutine[Any, Any, object]) -> asyncio.Task[object]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------------ health and placement

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self._health_s)
            try:
                await self._check_all()
            except Exception:  # the loop must survive anything one round throws
                log.exception("cluster_health_round_failed")

    async def _check_all(self) -> None:
        assert self._session is not None
        for url in await resolve_workers(self._endpoints):
            if url not in self.members:
                # a busy worker may answer late: only a refused or hung call counts as failed
                client = self._connect(url, self._session, self._health_timeout)
                self.members[url] = Member(url, client)
        results = await asyncio.gather(*(self._check(m) for m in self.members.values()))
        rates = await self._stats.refresh()
        demands = self.placer.demands(rates, len(self.healthy()))
        shape = {d.key: (d.replicas, d.heat) for d in demands}
        retry = self.placer.retry_due(time.monotonic())  # pins a worker refused, again
        if any(results) or shape != self._demand_shape or retry:  # rates: once per window
            self._demand_shape = shape
            self._dirty.set()

    def _worker_client(
        self, url: str, session: aiohttp.ClientSession, timeout: float
    ) -> ReplicaClient:
        return WorkerClient(url, self._token, session, timeout, self._unix_paths.get(url))

    async def _check(self, m: Member) -> bool:
        """Poll one worker; True when its membership changed."""
        try:
            load = await m.client.load()
            if not load.healthy:
                raise WorkerUnavailable("the worker's engine is not running")
            same = m.healthy and m.info is not None and m.info.boot_id == load.boot_id
            info = m.info if same else await m.client.info()
        except WorkerUnavailable as exc:
            m.refused = exc.refused
            if not exc.refused and time.monotonic() - m.last_output < self._health_timeout:
                return False  # late, but it streamed outputs just now: busy, not gone
            return self._take_out(m) if m.failed(refused=exc.refused) else False
        except (WireError, KeyError, ValueError):
            return self._take_out(m) if m.failed() else False
        m.failures, m.refused = 0, False
        m.observed(load)
        if load.waiting == 0:
            m.record_queue_delay(0.0)
        if same:
            return False
        m.info, m.healthy = info, True
        log.info("cluster_worker_up", worker=m.worker_id)
        self._watch_events(m)
        if self.forgets.owes(m):
            self._spawn(self.forgets.pay(m))
        return True

    def _take_out(self, m: Member) -> bool:
        m.healthy = False
        m.failures = max(m.failures, 1)
        self.failovers += 1
        self.index.drop_worker(m.worker_id)
        task = self._streams.pop(m.url, None)
        if task is not None:
            task.cancel()
        log.warning("cluster_worker_down", worker=m.worker_id)
        return True

    async def _reconcile_loop(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                await self.placer.reconcile(self.healthy(), self._stats.rates)
            except Exception:
                log.exception("cluster_reconcile_failed")

    def placement_settled(self) -> bool:
        """Every pin is held by exactly the live workers the placement names now."""
        live = self.healthy()
        plan = self.placer.plan(live, self._stats.rates)
        pins = self.placer.pins.values()
        settled = all(p.workers(live) == sorted(plan.workers_of(p.key)) for p in pins)
        return settled and not self._dirty.is_set()

    def set_endpoints(self, endpoints: Sequence[str]) -> None:
        """Workers to follow from the next health round on (a configuration change)."""
        self._endpoints = tuple(endpoints)

    async def settle(self) -> None:
        """Reconcile now (pins follow the current placement when this returns)."""
        await self.placer.reconcile(self.healthy(), self._stats.rates)

    def _watch_events(self, m: Member) -> None:
        old = self._streams.pop(m.url, None)
        if old is not None:
            old.cancel()
        self._streams[m.url] = asyncio.get_running_loop().create_task(self._events(m))

    async def _events(self, m: Member) -> None:
        wid = m.worker_id
        try:
            async for batch in m.client.events():
                # a sign of life while its requests stream nothing (interim=False)
                m.last_output = time.monotonic()
                self.index.apply(wid, batch)
        except (WorkerUnavailable, WireError):
            pass  # the health loop notices and takes it out, or resubscribes on recovery
        finally:
            self.index.drop_worker(wid)
            if self._streams.get(m.url) is asyncio.current_task():
                del self._streams[m.url]

    # ------------------------------------------------------------------ pins

    async def pin(self, owner: str, namespace: str, token_ids: Sequence[int]) -> TenantPin:
        """Pin a tenant's (``owner``'s) prompt on its placement set; returns when the set has
        it. The pin follows the placement from then on (gateway/cluster/placer.py)."""
        pin = TenantPin(owner, namespace, tuple(token_ids), self.block_size)
        if pin.blocks == 0:
            raise PinRejected("prefix shorter than one KV block", reason="too_short")
        self.placer.pins[pin.key] = pin
        await self.settle()
        return pin

    async def unpin(self, ticket: PinTicket) -> None:
        await self.placer.release(_tenant_pin(ticket), self.healthy())

    def pin_status(self, ticket: PinTicket | None) -> PinStatus:
        if ticket is None:
            return PinStatus(0, 0, None, {})
        return _tenant_pin(ticket).status(self.healthy())

    async def forget_namespace(self, namespace: str) -> bool:
        """Remove the namespace's disk snapshots on every worker (now, or when one that is away
        comes back); True when any file was removed now."""
        self.forgets.owe(self.members.values(), namespace)
        paid = await asyncio.gather(*(self.forgets.pay(m) for m in self.healthy().values()))
        return any(paid)

    # ------------------------------------------------------------------ requests

    async def generate(
        self,
        token_ids: Sequence[int],
        params: SamplingParams,
        options: GenerateOptions = DEFAULT_OPTIONS,
    ) -> AsyncGenerator[RequestOutput, None]:
        if self._closed:
            raise EngineClosed("the cluster client was shut down")
        rid = request_id_or_new(options.request_id)
        options = dataclasses.replace(options, request_id=rid)  # the same id on every retry
        namespace = options.namespace
        key = placement_key(namespace)
        self._stats.record(key)
        cost = len(token_ids) + params.max_tokens
        tried: set[str] = set()
        entry = Entry(rid, options.tenant, options.weight, options.priority, len(token_ids))
        generated = 0
        while True:
            route, slot = await self._admit(entry, key, token_ids, tried, options)
            m = route.member
            stream = m.client.generate(token_ids, params, options)  # its own iterator
            m.add_work(options.tenant, cost)
            self._flights[rid] = m
            try:
                first = await anext(stream)
            except (WorkerUnavailable, EngineOverloaded) as exc:
                self._leave(rid, m, cost, options.tenant)
                self.dispatch.release(slot)
                await _close(stream)
                tried.add(m.worker_id)
                self.retries += 1
                if isinstance(exc, WorkerUnavailable) and exc.refused and m.healthy:
                    self._take_out(m)  # gone: the health loop takes it back if it returns
                    self._dirty.set()
                continue
            except BaseException:
                self._leave(rid, m, cost, options.tenant)
                self.dispatch.release(slot)
                await _close(stream)
                raise
            break
        m.routed[route.reason if not tried else "retry"] += 1
        try:
            out = dataclasses.replace(first, worker=m.worker_id)  # who served it (the ledger's)
            while True:
                m.last_output = time.monotonic()
                generated = len(out.token_ids)
                yield out
                if out.finished:
                    q = out.metrics.queue_time
                    if q is not None:
                        m.record_queue_delay(q)
                    return
                out = await anext(stream)
        finally:
            self._leave(rid, m, cost, options.tenant)
            self.dispatch.release(slot, generated)
            await _close(stream)

    async def _admit(
        self,
        entry: Entry,
        key: str,
        ids: Sequence[int],
        tried: set[str],
        options: GenerateOptions,
    ) -> tuple[Route, Slot]:
        """The route, and a slot on its worker (gateway/cluster/dispatch.py: waits, in fair
        order, while every worker the request may go to is full)."""
        chosen: list[Route] = []

        def pick(room: Callable[[str], bool]) -> str | None:
            ns, scope, tenant = options.namespace, options.cache_scope, options.tenant
            route = self._route(key, ns, ids, tried, scope, tenant, room)
            if route is None:
                return None
            chosen.append(route)
            return route.member.worker_id

        slot = await self.dispatch.acquire(entry, pick)
        return chosen[-1], slot

    def _route(
        self,
        key: str,
        namespace: str,
        ids: Sequence[int],
        tried: set[str],
        scope: CacheScope | None = None,
        tenant: str = "default",
        room: Callable[[str], bool] | None = None,
    ) -> Route | None:
        """None: every worker the request may go to is full (``room``: the dispatcher's)."""
        members = [m for w, m in self.healthy().items() if w not in tried]
        degraded = not members
        if degraded:  # none healthy: a worker that answers late beats failing the request
            members = [
                m
                for m in self.members.values()
                if m.info is not None and not m.refused and m.worker_id not in tried
            ]
        pin = self.placer.pins.get(key)
        pinned_blocks = pin.blocks if pin is not None else 0
        # keyed like the engine keys them (the end user's scope past the shared prefix), so a
        # conversation is found on the worker holding it, and never another end user's
        index_ns, index_scope = self._index_keys(namespace, scope)
        blocks, holders = self.index.longest(index_ns, ids, self.block_size, index_scope)
        # a tenant pinned nowhere (no room) goes where its prompt is still cached, if anywhere
        floor = pinned_blocks if pin is not None and pin.handles else 0
        affinity = holders if blocks > floor else frozenset()
        placed = self.placer.placement.workers_of(key)
        if pin is not None:  # while a pin moves, its old holders serve until the new one has it
            held = [w for w in placed if w in pin.handles]
            placed = tuple(held) or tuple(w for w in pin.handles if w not in placed) or placed
        if room is not None:
            members = with_room(members, placed, affinity, room)
            if not members:
                return None
        route = choose(members, placed, key, affinity, self._spill_queue_s, tenant)
        if route is None:
            raise WorkerUnavailable("no healthy worker can take the request")
        return Route(route.member, "degraded") if degraded else route

    def _leave(self, rid: str, m: Member, cost: int, tenant: str) -> None:
        if self._flights.get(rid) is m:
            del self._flights[rid]
            m.end_work(tenant, cost)

    async def abort(self, request_id: str) -> None:
        m = self._flights.get(request_id)
        if m is not None:
            with contextlib.suppress(WorkerUnavailable):
                await m.client.abort(request_id)

    def check_integrity(self) -> None:
        for m in self.members.values():
            m.check_integrity()
        assert all(m.inflight > 0 for m in self._flights.values()), "flight without inflight"
        self.placer.check_integrity()
        self.dispatch.check_integrity()
        self.index.check_integrity()
        self.forgets.check_integrity()


def _tenant_pin(ticket: PinTicket) -> TenantPin:
    if not isinstance(ticket, TenantPin):
        raise TypeError(f"not a ticket of the cluster: {type(ticket).__name__}")
    return ticket


async def _close(stream: AsyncGenerator[object, None]) -> None:
    with contextlib.suppress(Exception):
        await stream.aclose()
