"""Copies between the device pool and the host tier, planned by the cache, done by the runner.

The cache queues a ``Transfer`` whenever its bookkeeping moves a block between tiers; the engine
takes the queue once per step (``PrefixCache.take_transfers``), the runner performs it *in queue
order* before that step's forward, then the engine reports it done
(``PrefixCache.finish_transfers``). Queue order is the logical order of the cache's decisions, so
a slot evicted and reused within one step is read (copied out) before it is overwritten::

    OUT  device block -> host slot   a READY block evicted (offload), or a pin moved to the host
    IN   host slot -> device block   a host hit at admission: the device block is LOADING until
                                     finish_transfers; readers of it run in the same step, after
                                     the copy (the runner orders copies before the forward)
"""

from __future__ import annotations

import enum
from typing import NamedTuple


class Direction(enum.Enum):
    OUT = "out"  # device -> host
    IN = "in"  # host -> device


class Transfer(NamedTuple):
    direction: Direction
    block_id: int  # device block
    slot: int  # host slot


class TransferPlan(NamedTuple):
    transfers: tuple[Transfer, ...]

    @property
    def is_empty(self) -> bool:
        return not self.transfers

    @property
    def num_in(self) -> int:
        return sum(1 for t in self.transfers if t.direction is Direction.IN)

    @property
    def num_out(self) -> int:
        return sum(1 for t in self.transfers if t.direction is Direction.OUT)


EMPTY_PLAN = TransferPlan(())
