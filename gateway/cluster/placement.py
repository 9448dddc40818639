"""Tenant placement: which workers pin each tenant's system prompt. Pure and deterministic.

Every gateway runs this on the same inputs (live workers with their pin budgets, tenants with
their prompt sizes and replica counts) and gets the same answer, with no leader::

    order tenants: most replicas first, then hotter heat level, then placement key
    for each tenant: walk its rendezvous (HRW) order of live workers, best score first;
                     take a worker while its remaining pin budget holds the prompt's blocks,
                     until the tenant has ``replicas`` workers (or the order is exhausted)

HRW keeps movement small: a worker that leaves only moves the tenants it held (and, through
capacity, the few that the moved ones displace); one that joins only takes tenants for which it
now scores best. A tenant that fits nowhere is left unplaced (routed by hash, cached by normal
retention). Heat levels are coarse (log2 of the request rate) so that small rate changes between
gateways or over time rarely reorder tenants, and tenants under HEAT_FLOOR_RPS are not ranked.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from hashlib import blake2b


@dataclass(frozen=True)
class WorkerSlot:
    worker_id: str
    pin_budget_blocks: int


@dataclass(frozen=True)
class TenantDemand:
    key: str  # placement key (a digest of the tenant's cache namespace)
    blocks: int  # KV blocks its pinned prompt takes
    replicas: int = 1
    heat: int = 0  # coarse traffic level (see ``heat_level``)


@dataclass(frozen=True)
class Placement:
    sets: dict[str, tuple[str, ...]]  # tenant key -> workers, HRW order
    used_blocks: dict[str, int] = field(default_factory=dict)  # worker -> pinned blocks
    blocks: dict[str, int] = field(default_factory=dict)  # tenant key -> blocks (the input)
    budgets: dict[str, int] = field(default_factory=dict)  # worker -> pin budget (the input)

    def workers_of(self, key: str) -> tuple[str, ...]:
        return self.sets.get(key, ())

    def check_integrity(self) -> None:
        used: dict[str, int] = {}
        for key, ws in self.sets.items():
            assert len(set(ws)) == len(ws), f"{key}: a worker twice"
            for w in ws:
                assert w in self.budgets, f"{key}: placed on unknown worker {w}"
                used[w] = used.get(w, 0) + self.blocks[key]
        for w, n in used.items():
            assert n <= self.budgets[w], (
                f"{w}: {n} blocks pinned over a budget of {self.budgets[w]}"
            )
        assert used == self.used_blocks, "used_blocks drifted"


def hrw_score(key: str, worker_id: str) -> int:
    digest = blake2b(f"{key}\x00{worker_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def hrw_order(key: str, worker_ids: Iterable[str]) -> list[str]:
    """Workers by descending rendezvous score for ``key`` (ties broken by id)."""
    return sorted(worker_ids, key=lambda w: (-hrw_score(key, w), w))


# Below this rate a tenant's count in a load window is a few requests: Poisson noise, not a
# ranking. Cold tenants all share heat 0 (ordered by key, so their placement holds still);
# ranking them by noise reshuffled who wins scarce pin room at every window and moved pins.
HEAT_FLOOR_RPS = 0.25


def heat_level(rate: float) -> int:
    """0 below HEAT_FLOOR_RPS, else 1 + floor(log4(rate / HEAT_FLOOR_RPS)): bands a factor of 4
    wide, so that rate noise rarely moves a tenant across a band."""
    return 0 if rate < HEAT_FLOOR_RPS else 1 + math.floor(math.log(rate / HEAT_FLOOR_RPS, 4))


def replicas_for(rate: float, replica_rate: float, num_workers: int) -> int:
    """One replica per ``replica_rate`` requests/s, at least one, at most every worker."""
    if num_workers <= 0:
        return 0
    return max(1, min(num_workers, math.ceil(rate / replica_rate))) if rate > 0 else 1


def place(workers: Sequence[WorkerSlot], tenants: Sequence[TenantDemand]) -> Placement:
    left = {w.worker_id: w.pin_budget_blocks for w in workers}
    ids = sorted(left)
    sets: dict[str, tuple[str, ...]] = {}
    for t in sorted(tenants, key=lambda t: (-t.replicas, -t.heat, t.key)):
        chosen: list[str] = []
        for w in hrw_order(t.key, ids):
            if len(chosen) >= t.replicas:
                break
            if left[w] >= t.blocks:
                left[w] -= t.blocks
                chosen.append(w)
        sets[t.key] = tuple(chosen)
    budgets = {w.worker_id: w.pin_budget_blocks for w in workers}
    used = {w: budgets[w] - left[w] for w in ids if budgets[w] > left[w]}
    return Placement(sets, used, {t.key: t.blocks for t in tenants}, budgets)
