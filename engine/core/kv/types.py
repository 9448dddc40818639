"""Typed results and inputs of the prefix cache (the scheduler-facing boundary objects)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol

from engine.core.kv.block import BlockState

MIN_PRIORITY = 0
MAX_PRIORITY = 100
DEFAULT_PRIORITY = 35


class PrefixMatch(NamedTuple):
    """Longest cached chain of full blocks; ``owners[i]`` computes PENDING block i (else None)."""

    block_ids: tuple[int, ...]
    states: tuple[BlockState, ...]
    owners: tuple[str | None, ...]
    block_size: int

    @property
    def num_blocks(self) -> int:
        return len(self.block_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.block_ids) * self.block_size

    @property
    def num_ready_tokens(self) -> int:
        """Tokens of the leading READY blocks (usable without waiting for any owner)."""
        n = 0
        for state in self.states:
            if state is not BlockState.READY:
                break
            n += 1
        return n * self.block_size


class Allocation(NamedTuple):
    """A request's block table after ``allocate``; ``match`` is its admission match."""

    block_table: tuple[int, ...]
    num_cached_tokens: int
    match: PrefixMatch


class Handoff(NamedTuple):
    """``request_id`` now owns PENDING blocks of a freed request: recompute from ``from_token``."""

    request_id: str
    from_token: int


class PriorityRange(NamedTuple):
    """Retention priority for tokens [start, end) (end None: to the end); 0 evicted first."""

    start: int
    end: int | None
    priority: int

    def check(self) -> None:
        if not MIN_PRIORITY <= self.priority <= MAX_PRIORITY:
            raise ValueError(f"priority must be in 0..100, got {self.priority}")
        if self.start < 0 or (self.end is not None and self.end < self.start):
            raise ValueError(f"bad token range [{self.start}, {self.end})")


# Where a worker keeps KV blocks: the device pool, or host memory (engine/core/kv/host_tier.py). The
# one declaration of the tier names: the cache, pin handles, KV events, the router's index.
Tier = Literal["device", "host"]
DEVICE: Tier = "device"
HOST: Tier = "host"
TIERS: tuple[Tier, ...] = (DEVICE, HOST)


@dataclass(frozen=True)
class PinHandle:
    pin_id: int
    namespace: str
    block_ids: tuple[int, ...]  # device blocks ("device" pins); empty for a host pin
    num_tokens: int
    tier: Tier = DEVICE  # or HOST: beyond the device pin cap, pinned in host memory


@dataclass(frozen=True)
class PinFailure:
    reason: str
    num_blocks: int = 0  # blocks the pin asked for
    num_new_blocks: int = 0  # of which not yet pinned
    pinned_blocks: int = 0  # blocks pinned at the time
    cap_blocks: int = 0

    def __bool__(self) -> bool:  # `if cache.pin(...):` reads as "pinned"
        return False


@dataclass(frozen=True)
class CacheStats:
    blocks_total: int
    blocks_free: int  # allocatable: empty + reclaimable (idle READY, unpinned)
    blocks_cached: int  # keyed READY blocks
    blocks_in_use: int  # held by at least one request
    blocks_pinned: int
    blocks_pending: int
    query_tokens: int
    hit_tokens: int
    evictions: int
    # host tier (engine/core/kv/host_tier.py); hit_tokens includes host_hit_tokens
    host_blocks_total: int = 0
    host_blocks_cached: int = 0
    host_blocks_pinned: int = 0
    host_hit_tokens: int = 0
    blocks_offloaded: int = 0  # device -> host copies
    blocks_restored: int = 0  # host -> device copies
    bytes_offloaded: int = 0
    bytes_restored: int = 0
    transfer_us: int = 0  # time spent performing the copies (restore latency, summed)
    snapshot_restores: int = 0  # pinned prompts restored from disk snapshots
    snapshot_restore_us: int = 0  # time of those restores, summed

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0


class CacheListener(Protocol):
    """Device events. A listener may also define ``on_tier(key, tier)`` (called when present):
    ``"host"`` after an offload, ``"device"`` after a restore, ``None`` when dropped from the host
    tier (engine/core/kv/tiering.py)."""

    def on_stored(
        self, namespace: str, key: bytes, parent_key: bytes | None, token_ids: tuple[int, ...]
    ) -> None: ...

    def on_removed(self, key: bytes) -> None: ...
