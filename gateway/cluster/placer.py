"""Pinned tenant prompts across workers: the placement's desired state made real.

``TenantPin`` is what the gateway's pin manager holds for a tenant's prompt version; its
per-worker engine handles change as the placement changes. ``Placer.reconcile`` brings the
workers in line with ``place(...)`` over the healthy workers, in this order::

    forget handles on workers that are gone or restarted (their pins died with them)
    unpin where a tenant is no longer placed (frees budget first)
    pin where a tenant is newly placed (concurrently, a few at a time)
    warm each tenant placed nowhere whose prompt no live worker was left holding: prefill it
        once, unpinned, on its rendezvous-first worker (where the router's hash sends it), in
        the background, WARM_CONCURRENCY at a time (a reconcile never waits for prefills: pins
        that follow a failed worker are not held up by them)

Warming uses the pool beyond the pin budget: there the prompts of tenants that lost the
competition for pin room live under normal retention. Without it a tenant that never had pin
room misses the cache on its first request, and those are the rarest tenants, whose first
request comes late (a rare tenant's first sight was the one miss left at 2 workers in bench
cluster). A tenant that loses its pin keeps its blocks where it was pinned (the router follows
them through the KV index), so it is not warmed again; a warmed prompt that normal retention
evicts later is not warmed again either (its next request computes it, as without a cluster).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from hashlib import blake2b
from typing import Any

import structlog

from engine.api import (
    GenerateOptions,
    PinHandle,
    PinStatus,
    PinTier,
    request_id_or_new,
)
from engine.errors import EngineError
from engine.params import SamplingParams
from engine.remote.messages import WireError
from gateway.cluster.members import Member
from gateway.cluster.placement import (
    Placement,
    TenantDemand,
    WorkerSlot,
    heat_level,
    hrw_order,
    place,
    replicas_for,
)

log = structlog.get_logger(__name__)
PIN_CONCURRENCY = 4
WARM_CONCURRENCY = 2  # prefills of unplaced tenants in flight, per gateway
PIN_RETRY_S = 2.0  # least time between retries of pins a worker refused


def placement_key(namespace: str) -> str:
    """A tenant's placement key: a digest of its cache namespace (the salt is never shown)."""
    return blake2b(namespace.encode(), digest_size=8, person=b"kvgate-pl").hexdigest()


@dataclass(eq=False)
class TenantPin:
    tenant_id: str
    namespace: str = field(repr=False)
    token_ids: tuple[int, ...] = field(repr=False)
    block_size: int
    handles: dict[str, tuple[str, PinHandle]] = field(default_factory=dict)  # worker -> (boot, h)
    rejected: dict[str, str] = field(default_factory=dict)  # worker -> reason

    @property
    def key(self) -> str:
        return placement_key(self.namespace)

    @property
    def blocks(self) -> int:
        return len(self.token_ids) // self.block_size

    def workers(self, live: Mapping[str, object]) -> list[str]:
        """Workers holding the pin among ``live`` ones."""
        return sorted(w for w in self.handles if w in live)

    def tiers(self, live: Mapping[str, object]) -> dict[str, str]:
        """Where each of the ``live`` holders keeps the pin: "device", or "host" (beyond its
        device pin cap, in host memory)."""
        return {w: h.tier for w, (_, h) in sorted(self.handles.items()) if w in live}

    @property
    def owner(self) -> str:  # engine/api.py PinTicket
        return self.tenant_id

    def status(self, live: Mapping[str, object]) -> PinStatus:
        """One replica's view for the pin manager's cache report, with every live holder."""
        tiers = self.tiers(live)
        held = bool(self.handles)
        blocks = len(next(iter(self.handles.values()))[1].block_ids) if held else 0
        tokens = self.blocks * self.block_size if held else 0
        return PinStatus(blocks, tokens, self.tier, tiers)

    @property
    def tier(self) -> PinTier | None:
        """The holders' tier when they agree, "mixed" when not, None when none holds it."""
        tiers = {h.tier for _, h in self.handles.values()}
        if len(tiers) > 1:
            return "mixed"
        return ("host" if tiers.pop() == "host" else "device") if tiers else None


class Placer:
    def __init__(self, replica_rate: float) -> None:
        self._replica_rate = replica_rate
        self.pins: dict[str, TenantPin] = {}  # placement key -> pin
        self.placement = Placement({})
        self.last_reconcile_s = 0.0  # how long the latest reconcile took
        self.moves = 0  # pins taken or released by reconciles, in total
        self._sem = asyncio.Semaphore(PIN_CONCURRENCY)
        # One reconcile at a time (the reconcile loop and ``settle`` calls from concurrent
        # tenant pins): two would both see a worker missing, pin it twice and keep one handle,
        # leaking the other's blocks on the worker until the pin cap refuses placed tenants.
        self._lock = asyncio.Lock()
        self._retry_at = 0.0  # monotonic time before which rejected pins are not retried
        # Released while their worker was out: (worker, boot, handle), unpinned if it returns.
        self.orphans: list[tuple[str, str, PinHandle]] = []
        # Tenant key -> (worker, boot) left holding its prompt unpinned (warmed, or unpinned
        # there when its placement moved): as long as that worker lives, no warming.
        self.left_on: dict[str, tuple[str, str]] = {}
        self.warm_unplaced = True  # off: tenants placed nowhere wait for their first request
        self.warms = 0  # prompts prefilled unpinned, in total
        self._warming: dict[str, asyncio.Task[None]] = {}  # tenant key -> prefill in flight
        self._warm_sem = asyncio.Semaphore(WARM_CONCURRENCY)

    def demands(self, rates: Mapping[str, float], num_workers: int) -> list[TenantDemand]:
        return [
            TenantDemand(
                key,
                pin.blocks,
                replicas_for(rates.get(key, 0.0), self._replica_rate, num_workers),
                heat_level(rates.get(key, 0.0)),
            )
            for key, pin in self.pins.items()
        ]

    def plan(self, members: Mapping[str, Member], rates: Mapping[str, float]) -> Placement:
        slots = [
            WorkerSlot(wid, m.info.pin_budget_blocks)
            for wid, m in sorted(members.items())
            if m.info is not None
        ]
        return place(slots, self.demands(rates, len(slots)))

    def retry_due(self, now: float) -> bool:
        """A pin the placement names was refused by a worker, and PIN_RETRY_S have passed."""
        if now < self._retry_at or not any(p.rejected for p in self.pins.values()):
            return False
        self._retry_at = now + PIN_RETRY_S
        return True

    async def reconcile(self, members: Mapping[str, Member], rates: Mapping[str, float]) -> None:
        """``members``: healthy workers by id."""
        async with self._lock:
            await self._reconcile(members, rates)

    async def _reconcile(self, members: Mapping[str, Member], rates: Mapping[str, float]) -> None:
        started = time.monotonic()
        self.placement = plan = self.plan(members, rates)
        unpins, pins = [], []
        for pin in list(self.pins.values()):
            want = set(plan.workers_of(pin.key))
            for wid in set(pin.rejected) - want:
                del pin.rejected[wid]  # no longer asked of that worker
            for wid, (boot, _) in list(pin.handles.items()):
                m = members.get(wid)
                if m is not None and m.info is not None and m.info.boot_id != boot:
                    del pin.handles[wid]  # restarted: the pin died with the old process
            # Handles on workers that are down are kept: if one comes back (same boot) its
            # pins are still there, and either used again or released then.
            for wid in sorted(set(pin.handles) - want):
                if wid in members:
                    unpins.append(self._unpin_one(pin, members[wid]))
            for wid in sorted(want - set(pin.handles)):
                pins.append(self._pin_one(pin, members[wid]))
        unpins += self._adopt_orphans(members)
        await asyncio.gather(*unpins)  # first: the room they free is what the new pins need
        await asyncio.gather(*pins)
        self._start_warming(plan, members)
        self.last_reconcile_s = time.monotonic() - started

    def _start_warming(self, plan: Placement, members: Mapping[str, Member]) -> None:
        """Prefills, in the background, of tenants placed nowhere whose prompt no live worker
        holds (one at a time per tenant)."""
        if not self.warm_unplaced:
            return
        live = sorted(w for w, m in members.items() if m.info is not None)
        for key, pin in self.pins.items():
            if not live or key in self._warming or plan.workers_of(key) or pin.workers(members):
                continue
            wid, boot = self.left_on.get(key, ("", ""))
            m = members.get(wid)
            if m is not None and m.info is not None and m.info.boot_id == boot:
                continue  # still there, unpinned
            task = asyncio.get_running_loop().create_task(
                self._warm_one(pin, members[hrw_order(key, live)[0]])
            )
            self._warming[key] = task
            task.add_done_callback(functools.partial(self._warm_done, key))

    def _warm_done(self, key: str, task: asyncio.Task[None]) -> None:
        if self._warming.get(key) is task:
            del self._warming[key]
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("cluster_warm_crashed", exc_info=exc)

    async def warmed(self) -> None:
        """Wait for the prefills in flight (and those they make way for) to end."""
        while self._warming:
            await asyncio.gather(*self._warming.values(), return_exceptions=True)

    async def close(self) -> None:
        """Stop the prefills in flight."""
        tasks = list(self._warming.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _warm_one(self, pin: TenantPin, m: Member) -> None:
        assert m.info is not None
        boot = m.info.boot_id
        params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        async with self._warm_sem:
            if self.pins.get(pin.key) is not pin:
                return  # unpinned meanwhile
            try:
                options = GenerateOptions(pin.namespace, request_id_or_new(None), interim=False)
                stream = m.client.generate(pin.token_ids, params, options)
                async for _ in stream:
                    pass
            except (EngineError, WireError) as exc:  # refused, or the worker went away: its
                # next request computes the prompt, as without a cluster
                error, tenant = type(exc).__name__, pin.tenant_id
                log.info("cluster_warm_failed", tenant=tenant, worker=m.worker_id, error=error)
                return
        self.warms += 1
        self.left_on[pin.key] = (m.worker_id, boot)

    async def _pin_one(self, pin: TenantPin, m: Member) -> None:
        assert m.info is not None
        boot = m.info.boot_id
        async with self._sem:
            if self.pins.get(pin.key) is not pin:
                return  # unpinned meanwhile
            try:
                handle = await m.client.pin(pin.namespace, pin.token_ids)
            except EngineError as exc:
                pin.rejected[m.worker_id] = getattr(exc, "reason", None) or type(exc).__name__
                log.info("cluster_pin_failed", tenant=pin.tenant_id, worker=m.worker_id)
                return
        pin.rejected.pop(m.worker_id, None)
        self.moves += 1
        if self.pins.get(pin.key) is not pin or m.worker_id in pin.handles:
            # unpinned while pinning, or held there already: give it back
            await _quiet_unpin(m, handle)
            return
        pin.handles[m.worker_id] = (boot, handle)

    async def _unpin_one(self, pin: TenantPin, m: Member) -> None:
        held = pin.handles.pop(m.worker_id, None)
        if held is None:
            return  # released meanwhile (``release`` unpins it)
        self.moves += 1
        boot, handle = held
        self.left_on[pin.key] = (m.worker_id, boot)  # its blocks stay there, unpinned
        await _quiet_unpin(m, handle)

    def _adopt_orphans(self, members: Mapping[str, Member]) -> list[Any]:
        jobs, kept = [], []
        for wid, boot, handle in self.orphans:
            m = members.get(wid)
            if m is None or m.info is None:
                kept.append((wid, boot, handle))
            elif m.info.boot_id == boot:
                jobs.append(_quiet_unpin(m, handle))
        self.orphans = kept
        return jobs

    async def release(self, pin: TenantPin, members: Mapping[str, Member]) -> None:
        """Forget ``pin`` and unpin it everywhere it is pinned."""
        if self.pins.get(pin.key) is pin:
            del self.pins[pin.key]
            self.left_on.pop(pin.key, None)
        handles, pin.handles = pin.handles, {}
        jobs = []
        for wid, (boot, handle) in handles.items():
            m = members.get(wid)
            if m is not None and m.info is not None and m.info.boot_id == boot:
                jobs.append(_quiet_unpin(m, handle))
            elif m is None:
                self.orphans.append((wid, boot, handle))  # out for now: unpin if it returns
        await asyncio.gather(*jobs)

    def check_integrity(self) -> None:
        for key, pin in self.pins.items():
            assert pin.key == key, f"{pin.tenant_id}: pin filed under a wrong key"
            assert not set(pin.handles) & set(pin.rejected), f"{pin.tenant_id}: pinned+rejected"
        self.placement.check_integrity()


async def _quiet_unpin(m: Member, handle: PinHandle) -> None:
    try:
        await m.client.unpin(handle)
    except EngineError as exc:  # the worker is going away: so is the pin
        log.info("cluster_unpin_failed", worker=m.worker_id, error=type(exc).__name__)
