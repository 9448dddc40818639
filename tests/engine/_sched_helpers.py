"""Shared helpers for scheduler tests: a fake paged-KV runner that checks what attention reads.

The fake model writes every new token's "K/V" (token id, position) into its slot first, then each
sequence reads positions [0, end) through its block table, exactly like the real runner (all K/V
of a layer written before any attention of it). Reading a slot that does not hold the request's
own token at that position fails the test: a dependent scheduled before its owner computed the
shared prefix, a wrong block table or a recycled block all show up here.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.config import EngineConfig
from engine.core.batch import ScheduledBatch
from engine.core.kv import PrefixCache
from engine.core.options import GenerateOptions
from engine.core.request import Request
from engine.core.scheduler import Scheduler
from engine.core.step_cost import StepCost
from engine.outputs import RequestOutput
from engine.params import SamplingParams

EOS = 0
VOCAB = 97


def next_token(tokens: Sequence[int]) -> int:
    """Deterministic 'model': a hash of the whole sequence (never EOS unless it says so)."""
    h = 1469598103934665603
    for t in tokens:
        h = ((h ^ (t + 1)) * 1099511628211) & 0xFFFFFFFFFFFF
    return 1 + h % (VOCAB - 1)


class FakeRunner:
    def __init__(self, block_size: int, *, eos_at: dict[str, int] | None = None) -> None:
        self.block_size = block_size
        self.slots: dict[int, tuple[int, int]] = {}
        self.truth: dict[str, list[int]] = {}
        self.eos_at = eos_at or {}  # request id -> generated index that returns EOS
        self.num_tokens = 0
        self.batches: list[ScheduledBatch] = []

    def register(self, rid: str, prompt: Sequence[int]) -> None:
        self.truth[rid] = list(prompt)

    def _slot(self, table: Sequence[int], pos: int) -> int:
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def execute(self, batch: ScheduledBatch) -> list[int | None]:
        self.batches.append(batch)
        self.num_tokens += batch.num_tokens
        for seq in batch.seqs:
            truth = self.truth[seq.request_id]
            assert list(seq.token_ids) == truth[seq.start_pos : seq.end_pos], "wrong chunk"
            for i, tok in enumerate(seq.token_ids):
                pos = seq.start_pos + i
                self.slots[self._slot(seq.block_table, pos)] = (tok, pos)
        out: list[int | None] = []
        for seq in batch.seqs:
            truth = self.truth[seq.request_id]
            for pos in range(seq.end_pos):
                got = self.slots.get(self._slot(seq.block_table, pos))
                assert got == (truth[pos], pos), (
                    f"{seq.request_id} reads {got} at position {pos}, expected {truth[pos]}"
                )
            if not seq.sample:
                out.append(None)
                continue
            assert seq.end_pos == len(truth), "sampling before the last token"
            eos = self.eos_at.get(seq.request_id) == seq.num_generated
            tok = EOS if eos else next_token(truth)
            truth.append(tok)
            out.append(tok)
        return out


def make_scheduler(
    num_blocks: int = 64,
    block_size: int = 4,
    *,
    enable_reuse: bool = True,
    max_model_len: int = 4096,
    cost: StepCost | None = None,
    **config: object,
) -> Scheduler:
    cfg = EngineConfig(block_size=block_size, enable_prefix_reuse=enable_reuse, **config)  # type: ignore[arg-type]
    cache = PrefixCache(num_blocks, block_size, enable_reuse=enable_reuse)
    return Scheduler(cfg, cache, max_model_len=max_model_len, eos_token_ids=[EOS], cost=cost)


def make_request(
    rid: str,
    prompt: Sequence[int],
    max_tokens: int = 4,
    *,
    namespace: str = "t",
    arrival: float = 0.0,
    **params: object,
) -> Request:
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, **params)  # type: ignore[arg-type]
    return Request(rid, tuple(prompt), sampling, GenerateOptions(namespace), arrival)


def add(sched: Scheduler, runner: FakeRunner, req: Request) -> None:
    sched.add_request(req)
    runner.register(req.request_id, req.prompt_token_ids)


def step(sched: Scheduler, runner: FakeRunner) -> tuple[ScheduledBatch, list[RequestOutput]]:
    batch = sched.schedule()
    sampled = runner.execute(batch) if not batch.is_empty else []
    outs = sched.update(batch, sampled)
    sched.check_integrity()
    return batch, outs


def run_all(
    sched: Scheduler, runner: FakeRunner, max_steps: int = 10_000
) -> dict[str, RequestOutput]:
    """Step until nothing is left; every step must schedule something (no idle step)."""
    finals: dict[str, RequestOutput] = {}
    for _ in range(max_steps):
        if not sched.has_unfinished():
            return finals
        batch, outs = step(sched, runner)
        assert not batch.is_empty or any(o.finished for o in outs), "idle step with work left"
        finals.update({o.request_id: o for o in outs if o.finished})
    raise AssertionError("requests did not finish")


def solo_output(prompt: Sequence[int], max_tokens: int) -> tuple[int, ...]:
    toks = list(prompt)
    for _ in range(max_tokens):
        toks.append(next_token(toks))
    return tuple(toks[len(prompt) :])
