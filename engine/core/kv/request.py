"""Per-request state kept by the prefix cache.

A request's block table, with the blocks it attached at admission first::

    pos:     0 .. num_attached-1        | num_attached .. len(blocks)-1
    blocks:  shared (READY or PENDING,  | its own: PENDING (registered, owned by it) while full
             owned by other requests)   | and its key was free, else private (EMPTY)

``keys[i]`` is the content key of full block i (kept incrementally: never rehashed) under the
request's namespace and cache scope (engine/core/kv/hashing.py). Once one of
its full blocks is private, every later block of the request stays private too, so a registered
block's parent is always held by the request that registered it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.kv.block import Block
from engine.core.kv.hashing import CacheScope
from engine.core.kv.types import Allocation, PrefixMatch, PriorityRange


@dataclass(eq=False, slots=True)
class RequestState:
    request_id: str
    namespace: str
    admit_order: int  # admission sequence number: earlier attached = smaller
    match: PrefixMatch
    priorities: tuple[PriorityRange, ...]
    scope: CacheScope | None = None  # fixed at admission: keys past its shared part are private
    tokens: list[int] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    num_attached: int = 0
    num_computed: int = 0  # tokens [0, num_computed) have K/V written (last commit)
    owned: list[int] = field(default_factory=list)  # positions of blocks it registered/inherited
    owned_pos: int = 0  # owned[:owned_pos] are READY (or no longer its own)
    ready_upto: int = 0  # attached blocks [0, ready_upto) are READY
    owners: set[str] = field(default_factory=set)  # requests owning blocks it attached to
    dependents: dict[str, None] = field(default_factory=dict)  # requests attached to its blocks
    allocation: Allocation | None = None  # last result, returned again while the table is unchanged

    @property
    def num_cached_tokens(self) -> int:
        return self.match.num_tokens

    def holds(self, block: Block) -> bool:
        pos = block.pos
        return 0 <= pos < len(self.blocks) and self.blocks[pos] is block

    def block_priority(self, pos: int, block_size: int, default: int) -> int:
        """Max priority of this request's ranges overlapping block ``pos`` (default if none)."""
        start = pos * block_size
        end = start + block_size
        best = -1
        for rng in self.priorities:
            if rng.start < end and (rng.end is None or rng.end > start) and rng.priority > best:
                best = rng.priority
        return default if best < 0 else best
