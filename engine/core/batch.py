"""The boundary object between the scheduler and the model runner (plain Python; no torch).

One step = ``scheduler.schedule() -> runner.execute(batch) -> scheduler.update(batch, sampled)``.

Per request the runner gets the *new* tokens to compute this step and where they start::

    positions:   0 ........ start_pos-1 | start_pos ...... start_pos+len(token_ids)-1
    K/V:         already in the cache    | written by this step, before attention reads it
    block_table: covers at least start_pos + len(token_ids) tokens

The cached part may include blocks that another request of the *same* batch computes in this very
step (early reuse): the runner writes every new K/V of a layer before any attention of that layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.outputs import TokenLogprob
from engine.params import SamplingParams


@dataclass(frozen=True)
class ScheduledSeq:
    request_id: str
    token_ids: Sequence[int]  # new tokens computed this step (prefill chunk or one decode token)
    start_pos: int  # tokens already in the KV cache before this chunk
    block_table: Sequence[int]  # physical block ids, logical order
    sample: bool  # True when this chunk ends at the request's last token: produce one token
    sampling: SamplingParams
    num_generated: int = 0  # tokens generated so far (seeded sampling: seed + step index)
    # The request's prompt + generated tokens (its own list, read only; the last
    # ``num_generated`` are the generated ones): what penalties count.
    history: Sequence[int] = ()

    @property
    def end_pos(self) -> int:
        return self.start_pos + len(self.token_ids)


@dataclass(frozen=True)
class ScheduledBatch:
    seqs: Sequence[ScheduledSeq]

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.seqs)

    @property
    def is_empty(self) -> bool:
        return not self.seqs


@dataclass(frozen=True, slots=True)
class FinalToken:
    """A sampled token after which the request's grammar ends it (engine/runtime/grammar/):
    the output is complete (``error`` None: finish "stop"), or the grammar engine failed on it
    (finish "abort" with ``GrammarRejected(error)``). Stands in the runner's result where the
    token alone would."""

    sampled: int | TokenLogprob
    error: str | None = None


# What ``runner.execute`` returns per scheduled seq (``None`` for a seq that does not sample).
Sampled = int | TokenLogprob | FinalToken
