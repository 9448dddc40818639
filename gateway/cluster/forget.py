"""Removals of a deleted tenant's disk snapshots, owed to every worker until each has done it.

A worker that is down (or unreachable) when the tenant is deleted keeps the removal owed here and
gets it when the health loop takes it in again. What is owed lives in this gateway's memory
(bounded per worker, oldest dropped first): a worker that is still away when every gateway has
restarted keeps the file (docs/tiers.md).
"""

from __future__ import annotations

from collections.abc import Iterable

import structlog

from engine.remote.channel import WorkerUnavailable
from engine.remote.messages import WireError
from gateway.cluster.members import Member

log = structlog.get_logger(__name__)
MAX_OWED_PER_WORKER = 10_000


class SnapshotForgets:
    def __init__(self, cap: int = MAX_OWED_PER_WORKER) -> None:
        self._cap = cap
        # worker (by id, or by url while its id is unknown) -> namespaces, oldest first
        self._owed: dict[str, dict[str, None]] = {}

    def owe(self, members: Iterable[Member], namespace: str) -> None:
        for m in members:
            owed = self._owed.setdefault(m.worker_id, {})
            owed[namespace] = None
            while len(owed) > self._cap:
                del owed[next(iter(owed))]

    def owes(self, m: Member) -> bool:
        return bool(self._owed.get(m.worker_id) or self._owed.get(m.url))

    async def pay(self, m: Member) -> bool:
        """Send ``m`` what it is owed; True when it removed any file. A failed call keeps the
        rest owed (retried when the worker is taken in again)."""
        if m.url in self._owed and m.url != m.worker_id:  # owed before its id was known
            for ns in self._owed.pop(m.url):
                self._owed.setdefault(m.worker_id, {})[ns] = None
        owed = self._owed.get(m.worker_id, {})
        removed = False
        for ns in list(owed):
            try:
                removed = await m.client.forget(ns) or removed
            except (WorkerUnavailable, WireError) as exc:
                log.warning("snapshot_forget_deferred", worker=m.worker_id, error=str(exc))
                return removed
            owed.pop(ns, None)
        if not owed:
            self._owed.pop(m.worker_id, None)
        return removed

    def check_integrity(self) -> None:
        for worker, owed in self._owed.items():
            assert len(owed) <= self._cap, f"{worker}: {len(owed)} owed removals"
