"""Per-request state owned by the scheduler (plain Python; no torch).

Token layout of a request (prompt followed by generated tokens)::

    all_token_ids: [ prompt ........................ | out_0 out_1 ... out_k ]
                     0 ........... num_computed-1   | num_computed ... num_tokens-1
                     K/V written (or attached from  | not yet through the model; the last
                     the prefix cache)              | sampled token is always here

A running request always has at least one uncomputed token: prefill leaves the rest of the prompt,
decode leaves the token sampled last step. A preempted request goes back to WAITING with
``num_computed = 0`` and recomputes prompt + generated tokens (minus what the cache still holds).
"""

from __future__ import annotations

import dataclasses
import enum
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.core.fairness import Priority
from engine.core.kv import CacheScope, PriorityRange
from engine.core.options import GenerateOptions
from engine.outputs import FinishReason, RequestMetrics, RequestOutput, TokenLogprob
from engine.params import SamplingParams


def request_id_or_new(request_id: str | None) -> str:
    """The caller's request id, else a new one unique across processes (streaming front ends:
    an async engine or a cluster client, whose ids may meet in one worker)."""
    return request_id if request_id is not None else f"req-{uuid.uuid4().hex}"


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """One request in the scheduler: what to sample (``sampling``), how it is served
    (``options``: the caller's ``GenerateOptions`` as given, read through the properties below)
    and its progress."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams
    options: GenerateOptions
    arrival_time: float

    status: RequestStatus = RequestStatus.WAITING
    all_token_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    block_table: tuple[int, ...] = ()
    enqueued_step: int = 0  # scheduler step it (re)entered the waiting queue (batch aging)
    admit_seq: int = -1  # order of the latest admission; running is kept sorted by it
    may_have_deps: bool = False  # attached to PENDING blocks at admission (cleared once resolved)
    num_cached_tokens: int | None = None  # cache hit at first admission (usage reporting)
    num_preemptions: int = 0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    finish_reason: FinishReason | None = None
    error: Exception | None = None
    num_reported: int = 0  # generated tokens already handed out in an output
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per generated token, if asked

    def __post_init__(self) -> None:
        if not self.all_token_ids:
            self.all_token_ids = list(self.prompt_token_ids)

    @property
    def namespace(self) -> str:
        return self.options.namespace

    @property
    def priorities(self) -> tuple[PriorityRange, ...]:
        return self.options.priorities

    @priorities.setter
    def priorities(self, ranges: tuple[PriorityRange, ...]) -> None:
        self.options = dataclasses.replace(self.options, priorities=ranges)

    @property
    def cache_scope(self) -> CacheScope | None:
        """Private prefix-cache keys past its shared part (engine/core/kv/hashing.py)."""
        return self.options.cache_scope

    @cache_scope.setter
    def cache_scope(self, scope: CacheScope | None) -> None:
        self.options = dataclasses.replace(self.options, cache_scope=scope)

    @property
    def tenant(self) -> str:
        """Whose fair share it is served from (engine/core/fairness.py)."""
        return self.options.tenant

    @property
    def weight(self) -> float:
        """The tenant's weight (the latest request's wins)."""
        return self.options.weight

    @property
    def priority(self) -> Priority:
        return self.options.priority

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def output_token_ids(self) -> Sequence[int]:
        return self.all_token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def metrics(self) -> RequestMetrics:
        return RequestMetrics(
            arrival_time=self.arrival_time,
            first_scheduled_time=self.first_scheduled_time,
            first_token_time=self.first_token_time,
            finish_time=self.finish_time,
            num_preemptions=self.num_preemptions,
        )

    def make_output(self) -> RequestOutput:
        """Output carrying the tokens generated since the previous output of this request."""
        out = tuple(self.output_token_ids)
        start, self.num_reported = self.num_reported, len(out)
        new = out[start:]
        logprobs = None
        if self.sampling.logprobs is not None:
            logprobs = tuple(self.logprobs[start : len(out)])
        return RequestOutput(
            request_id=self.request_id,
            num_prompt_tokens=self.num_prompt_tokens,
            token_ids=out,
            new_token_ids=new,
            num_cached_tokens=self.num_cached_tokens or 0,
            finished=self.finished,
            finish_reason=self.finish_reason,
            metrics=self.metrics(),
            error=self.error,
            new_logprobs=logprobs,
        )
