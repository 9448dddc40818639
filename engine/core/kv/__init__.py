"""Paged KV block pool and prefix cache (pure Python; imports no torch).

Contract with the scheduler: docs/contracts.md, section "engine/core/kv <->
engine/core/scheduler.py".
"""

from __future__ import annotations

from engine.core.kv.block import BlockState
from engine.core.kv.hashing import CacheScope
from engine.core.kv.prefix_cache import PrefixCache
from engine.core.kv.types import (
    DEFAULT_PRIORITY,
    Allocation,
    CacheListener,
    CacheStats,
    Handoff,
    PinFailure,
    PinHandle,
    PrefixMatch,
    PriorityRange,
)

__all__ = [
    "DEFAULT_PRIORITY",
    "Allocation",
    "BlockState",
    "CacheListener",
    "CacheScope",
    "CacheStats",
    "Handoff",
    "PinFailure",
    "PinHandle",
    "PrefixCache",
    "PrefixMatch",
    "PriorityRange",
]
