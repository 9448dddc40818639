"""What the engine hands back per request: token deltas, the final result and timings (no torch).

Times are ``time.monotonic()`` seconds taken in the engine process; only differences mean anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None  # first step that computed any of its tokens
    first_token_time: float | None = None  # first sampled token
    finish_time: float | None = None
    num_preemptions: int = 0

    @property
    def ttft(self) -> float | None:
        """Time to first token, from arrival."""
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def queue_time(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    @property
    def latency(self) -> float | None:
        if self.finish_time is None:
            return None
        return self.finish_time - self.arrival_time


@dataclass(frozen=True)
class TokenLogprob:
    """Log-probability of one generated token and the ``k`` most likely alternatives at its
    position (raw model distribution; under a grammar, over the tokens it allows there), most
    likely first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class RequestOutput:
    """One update of a request.

    ``new_token_ids`` are the tokens generated since the previous update of the same request;
    ``token_ids`` all generated so far (the stop / eos token, when one ended the request, included).
    ``num_cached_tokens``: prompt tokens found in the prefix cache at (first) admission.
    """

    request_id: str
    num_prompt_tokens: int
    token_ids: tuple[int, ...]
    new_token_ids: tuple[int, ...]
    num_cached_tokens: int
    finished: bool
    finish_reason: FinishReason | None
    metrics: RequestMetrics
    error: Exception | None = None  # set when the engine gave up on the request (finish "abort")
    # One entry per ``new_token_ids`` entry when the request asked for logprobs, else None.
    new_logprobs: tuple[TokenLogprob, ...] | None = None
    # The engine worker process that served the request, on its first output (set by the
    # gateway's cluster client, gateway/cluster/engine.py); None from an engine in this process.
    worker: str | None = None
