"""``EngineClient``: the one interface the gateway calls an engine through (no torch here).

Two implementations, one contract: ``AsyncEngine`` (engine/serving/async_engine.py, the engine in
this process) and ``ClusterEngine`` (gateway/cluster/engine.py, the engine in worker processes);
test fakes declare it too. The gateway holds an ``EngineClient`` and never asks which one it has::

    generate(ids, params, GenerateOptions(...)) -> stream of RequestOutput     (one stream type)
    abort(request_id)                                                         (no-op if unknown)
    pin(owner, namespace, ids) -> PinTicket;  unpin(ticket);  pin_status(ticket | None)
    forget_namespace(namespace) -> bool                 (disk snapshots of a deleted tenant)
    cache_stats() -> CacheStats;  info -> EngineInfo;  is_running;  start();  shutdown()

Per-request choices travel in ONE frozen ``GenerateOptions``: a field added here (a tenant
weight, a priority class) reaches every engine and the worker protocol without a new
keyword on any signature (engine/remote/messages.py encodes the options object as it is).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from engine.core.fairness import FairShare, Priority, pick_waiting
from engine.core.kv import CacheScope, CacheStats, PinHandle, PriorityRange
from engine.core.options import DEFAULT_OPTIONS, GenerateFields, GenerateOptions
from engine.core.request import request_id_or_new
from engine.outputs import RequestOutput
from engine.params import SamplingParams

if TYPE_CHECKING:
    from engine.text.tokenizer import Tokenizer

# The engine's types that travel through this interface, named here so that a caller (the
# gateway) needs no import below the boundary. ``FairShare`` and ``pick_waiting`` (the fair
# share's counters and its choice of the next waiting request, torch-free) are named for the
# gateway's dispatcher in front of engines it does not schedule (gateway/cluster/dispatch.py):
# one policy, not a second one written beside it.
__all__ = [
    "DEFAULT_OPTIONS",
    "NO_PIN",
    "CacheScope",
    "CacheStats",
    "EngineClient",
    "EngineInfo",
    "FairShare",
    "GenerateFields",
    "GenerateOptions",
    "LocalPin",
    "PinHandle",
    "PinStatus",
    "PinTicket",
    "PinTier",
    "Priority",
    "PriorityRange",
    "pick_waiting",
    "request_id_or_new",
]

PinTier = Literal["device", "host", "mixed"]


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """What the gateway needs to know of the model an engine serves."""

    tokenizer: Tokenizer
    max_model_len: int  # prompt + output tokens one request may hold
    block_size: int  # tokens per KV block (a pin shorter than one block is refused)
    # the grammar kinds (engine/constraints: json_schema, lark, regex) the engine enforces; the
    # gateway refuses, or serves without a grammar, what needs another (vLLM: no lark)
    grammars: frozenset[str] = frozenset({"json_schema", "lark", "regex"})


class PinTicket(Protocol):
    """What ``pin`` hands back and ``unpin`` takes: only the engine that issued a ticket may be
    given it back (another engine's ticket is a TypeError)."""

    @property
    def owner(self) -> str:
        """Who the pin is for (a tenant id): the cluster places and reports pins by it."""
        ...

    @property
    def namespace(self) -> str: ...


@dataclass(frozen=True, slots=True)
class PinStatus:
    """Where a pinned prefix is held now (read by reports; never the salt or the tokens)."""

    blocks: int  # KV blocks of one copy (0: held nowhere)
    tokens: int
    tier: PinTier | None  # "mixed": the holders differ; None: held nowhere
    holders: dict[str, str] | None  # worker id -> tier; None for an engine in this process


NO_PIN = PinStatus(0, 0, None, None)  # the in-process engine's status of no pin


@dataclass(frozen=True, slots=True)
class LocalPin:
    """The in-process engine's ticket: the prefix cache's own handle."""

    owner: str
    handle: PinHandle

    @property
    def namespace(self) -> str:
        return self.handle.namespace

    def status(self) -> PinStatus:
        tier: PinTier = "host" if self.handle.tier == "host" else "device"
        return PinStatus(len(self.handle.block_ids), self.handle.num_tokens, tier, None)


class EngineClient(Protocol):
    """The engine as the gateway sees it. Errors are engine/errors.py's classes wherever the
    engine runs (a worker's are rebuilt by class on the gateway's side)."""

    @property
    def info(self) -> EngineInfo: ...

    @property
    def is_running(self) -> bool:
        """Started, not shut down, and able to serve (a cluster: some worker is healthy)."""
        ...

    def generate(
        self,
        token_ids: Sequence[int],
        params: SamplingParams,
        options: GenerateOptions = DEFAULT_OPTIONS,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Outputs of one request until its final one (``finished``): token deltas in
        ``new_token_ids``, everything so far in ``token_ids``.

        Admission errors (PromptTooLong, EngineOverloaded, DuplicateRequestId, GrammarRejected
        for a ``params.grammar`` that does not compile, ValueError) are raised by the first
        ``anext`` before anything was generated. A caller that has seen no output knows nothing
        was generated (a cluster has then retried elsewhere already); a stream that breaks after
        outputs ends with an EngineDead (WorkerLost), or with GrammarRejected when the grammar
        engine failed mid-output (docs/contracts.md, Grammars). Leaving the
        iteration early (break, cancellation, ``aclose``) aborts the request and frees its
        blocks.
        """
        ...

    async def abort(self, request_id: str) -> None:
        """End a request in flight (no-op if unknown); its stream ends with finish "abort"."""
        ...

    async def pin(self, owner: str, namespace: str, token_ids: Sequence[int]) -> PinTicket:
        """Compute the prefix once (or find it cached) and keep its full blocks cached until
        ``unpin``; may wait for a prefill queued behind requests. PinRejected when refused
        (shorter than one block, pin cap reached, reuse off). A cluster keeps the pin on the
        owner's placement set of workers and moves it as workers come and go."""
        ...

    async def unpin(self, ticket: PinTicket) -> None: ...

    def pin_status(self, ticket: PinTicket | None) -> PinStatus:
        """Where ``ticket``'s prefix is held now; None (no pin held): held nowhere, with the
        engine's kind of ``holders`` (a cluster: none, ``{}``; in this process: None)."""
        ...

    async def forget_namespace(self, namespace: str) -> bool:
        """Remove the namespace's disk snapshots (its tenant is gone); whether one was removed
        now (a cluster owes the removal to workers that are away until they come back)."""
        ...

    def cache_stats(self) -> CacheStats:
        """Block and hit counters (a cluster: summed over healthy workers); never blocks."""
        ...

    async def start(self) -> None: ...

    async def shutdown(self) -> None:
        """Abort what is in flight and release everything (idempotent)."""
        ...
