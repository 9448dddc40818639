"""Early-reuse handoff: an owner leaves before computing the PENDING blocks others attached to.

Each such block passes to its earliest-admitted other holder (the heir), which recomputes it from
the block's first token; the gone owner's remaining dependents now wait on the heir instead::

    before:  gone --owns--> block i (PENDING) <--holds-- dep A (admitted 3), dep B (admitted 5)
    after:   A --owns--> block i; A recomputes from i * block_size; B depends on A

Only ``RequestState`` links change here; ref counts and the pool stay with ``PrefixCache.free``.
"""

from __future__ import annotations

from engine.core.kv.block import Block
from engine.core.kv.request import RequestState


def pick_heir(requests: dict[str, RequestState], gone: RequestState, block: Block) -> RequestState:
    """The earliest-admitted other holder of ``block`` (a dependent of its owner ``gone``)."""
    best: RequestState | None = None
    for dep_id in gone.dependents:
        dep = requests.get(dep_id)
        if (
            dep is not None
            and dep.holds(block)
            and (best is None or dep.admit_order < best.admit_order)
        ):
            best = dep
    assert best is not None, f"{block!r} has holders but none is a dependent of its owner"
    return best


def inherit(
    requests: dict[str, RequestState], heir: RequestState, gone: RequestState, from_token: int
) -> None:
    """``heir`` now owns some of ``gone``'s PENDING blocks and recomputes from ``from_token``."""
    rid = heir.request_id
    mine = set(heir.owned[heir.owned_pos :])
    mine.update(pos for pos in range(heir.num_attached) if heir.blocks[pos].owner == rid)
    heir.owned = sorted(mine)
    heir.owned_pos = 0
    heir.num_computed = min(heir.num_computed, from_token)
    heir.owners.discard(gone.request_id)
    for dep_id in gone.dependents:
        dep = requests.get(dep_id)
        if dep is not None and dep is not heir:
            heir.dependents[dep_id] = None
            dep.owners.add(rid)
