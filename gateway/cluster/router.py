"""Which worker serves a request, and why (the reason is counted per worker).

1. affinity   a worker holds more of this prompt than the pinned system prompt (an earlier
              turn of the conversation: KV-event index, keyed in the end user's cache scope,
              so only the end user's own turns count), and its queue is short
2. placement  the least-loaded worker of the tenant's placement set: outstanding tokens, the
              tenant's own counted twice (a burst spreads over the set, not onto one worker)
3. spill      every worker of the set has a queue delay over the threshold: the least-loaded
              healthy worker anywhere
4. hash       the tenant is placed nowhere (no room): its rendezvous-first healthy worker
5. degraded   no worker is healthy: the same choice among workers that only answered late
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from gateway.cluster.members import Member
from gateway.cluster.placement import hrw_order


@dataclass(frozen=True)
class Route:
    member: Member
    reason: str


def choose(
    members: Sequence[Member],
    placed: Sequence[str],
    key: str,
    affinity: Collection[str],
    spill_queue_s: float,
    tenant: str = "default",
) -> Route | None:
    """``members``: healthy candidates; ``placed``: the tenant's placement set (worker ids);
    ``affinity``: workers holding the conversation beyond the pinned prefix."""
    if not members:
        return None
    by_id = {m.worker_id: m for m in members}
    near = [by_id[w] for w in sorted(affinity) if w in by_id]
    short = [m for m in near if m.queue_delay_s <= spill_queue_s]
    if short:
        return Route(min(short, key=_cost), "affinity")
    pool = [by_id[w] for w in placed if w in by_id]
    if pool:
        fresh = [m for m in pool if m.queue_delay_s <= spill_queue_s]
        if fresh:
            return Route(
                min(fresh, key=lambda m: (m.tenant_cost(tenant), m.worker_id)), "placement"
            )
        best = min(members, key=_cost)
        if best not in pool and best.queue_delay_s < min(m.queue_delay_s for m in pool):
            return Route(best, "spill")
        return Route(min(pool, key=_cost), "placement")
    first = hrw_order(key, by_id)[0]
    return Route(by_id[first], "hash")


def _cost(m: Member) -> tuple[int, str]:
    return (m.cost, m.worker_id)
