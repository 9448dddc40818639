"""``GenerateOptions``: how one request is served, one frozen object from the caller to the
scheduler's ``Request`` (engine/core/request.py), through ``EngineClient.generate``
(engine/api.py, which names it for callers), the worker protocol (encoded as it is) and
``EngineCore.add_request``: never unpacked into keywords on the way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypedDict, Unpack

from engine.core.fairness import Priority
from engine.core.kv import CacheScope, PriorityRange


@dataclass(frozen=True, slots=True)
class GenerateOptions:
    """How one request is served (not what is sampled: that is ``SamplingParams``).

    ``namespace``: the prefix-cache key space (a tenant's cache salt); ``request_id``: None picks
    a fresh one (ids of requests in flight are unique per engine); ``priorities``: retention of
    token ranges in the cache; ``interim=False``: only the first and the final output (whose
    delta is every token since the first); ``cache_scope``: keys past its shared tokens are
    private to one end user (engine/core/kv/hashing.py); ``tenant``, ``weight``: whose fair
    share of the engine serves it and that share's weight (engine/core/fairness.py: the
    latest request of a tenant sets its weight); ``priority``: ``batch`` uses only capacity
    ``interactive`` requests leave free, within the starvation bound of docs/contracts.md.
    """

    namespace: str = "default"
    request_id: str | None = None
    priorities: tuple[PriorityRange, ...] = ()
    interim: bool = True
    cache_scope: CacheScope | None = None
    tenant: str = "default"
    weight: float = 1.0
    priority: Priority = "interactive"

    def __post_init__(self) -> None:
        if not isinstance(self.priorities, tuple):  # a list would make the options unhashable
            object.__setattr__(self, "priorities", tuple(self.priorities))
        if not self.weight > 0:
            raise ValueError(f"weight must be > 0, got {self.weight}")
        if self.priority not in ("interactive", "batch"):
            raise ValueError(f"priority must be interactive or batch, got {self.priority!r}")

    @classmethod
    def of(
        cls, options: GenerateOptions | None = None, /, **given: Unpack[GenerateFields]
    ) -> GenerateOptions:
        """``options`` (default: the defaults) with the fields named in ``given`` replaced: the
        keyword form of ``AsyncEngine.generate``. An unknown name is a TypeError."""
        base = options if options is not None else DEFAULT_OPTIONS
        return dataclasses.replace(base, **given) if given else base


class GenerateFields(TypedDict, total=False):
    """``GenerateOptions``' fields as keywords (``AsyncEngine.generate(..., namespace=...)``);
    tests/engine/test_api.py keeps the two in step."""

    namespace: str
    request_id: str | None
    priorities: tuple[PriorityRange, ...]  # any sequence: the options keep a tuple
    interim: bool
    cache_scope: CacheScope | None
    tenant: str
    weight: float
    priority: Priority


DEFAULT_OPTIONS = GenerateOptions()
