"""Synthetic steps the GPU runner runs before the engine reports ready.

* ``profile_batch``: the largest step the scheduler can produce (``max_num_batched_tokens`` new
  tokens over as many sampling requests as allowed): its peak memory sizes the KV cache.
* ``warmup_batches``: one step per kernel *plan* a geometry can reach, so every Triton variant is
  compiled at load, not in the middle of live traffic::

      prefill alone        chunks of 2, 17 and 65 tokens (one per tile shape of the extend kernel)
      mixed                decode rows + each chunk size (indexed split-KV + extend skipping them)
      decode               short context (one split, direct output) and long (splits + merge),
                           one request and many
      cascade              the fewest requests that fit over a prefix worth sharing (2 x 4096
                           tokens, 3 x 2048, ..., 17 x 256): decode with a short own suffix
                           (fused merge) and a long one (suffix splits), mixed with each chunk
                           size, and query-token counts reaching each row tile of the shared pass

Block tables are laid out round-robin over the pool: the steps write finite garbage into the
KV cache, which the runner zeroes afterwards. Token ids are arbitrary valid ids.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from engine.core.batch import ScheduledBatch, ScheduledSeq
from engine.params import SamplingParams
from engine.runtime.kernels.cascade_rule import CASCADE_MIN_SAVED_TOKENS, CASCADE_MIN_SHARED_TOKENS

CHUNKS = (65, 17, 2)  # the smallest of each extend tile bucket: > 64, 17..64, <= 16
SHORT_CONTEXT = 10
LONG_CONTEXT = 2048  # enough keys for several KV splits on any GPU
CASCADE_LONG_SUFFIX = 600  # two KV splits of at least 256 keys in the suffix pass
GREEDY = SamplingParams(temperature=0.0, max_tokens=1)


@dataclass(frozen=True)
class StepLimits:
    """What bounds a step: the engine's limits and the pool."""

    block_size: int
    num_blocks: int
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    vocab_size: int
    gqa_group: int = 1  # query heads per KV head


class _Tables:
    """Block tables handed out round-robin over the pool (warm-up content is garbage)."""

    def __init__(self, limits: StepLimits) -> None:
        self.limits = limits
        self._next = itertools.count()

    def table(self, num_tokens: int, shared: tuple[int, ...] = ()) -> tuple[int, ...]:
        bs, n = self.limits.block_size, self.limits.num_blocks
        need = -(-num_tokens // bs) - len(shared)
        return shared + tuple(next(self._next) % n for _ in range(max(0, need)))


def _seq(
    limits: StepLimits, rid: str, num_new: int, start: int, table: tuple[int, ...]
) -> ScheduledSeq:
    tokens = [(start + i) * 7919 % limits.vocab_size for i in range(num_new)]
    return ScheduledSeq(
        request_id=rid, token_ids=tokens, start_pos=start, block_table=table, sample=True,
        sampling=GREEDY,
    )  # fmt: skip


def profile_batch(limits: StepLimits) -> ScheduledBatch:
    """The largest step the scheduler can produce: ``max_num_batched_tokens`` prompt tokens (at
    most max_num_seqs x max_model_len) over as many requests as allowed, each sampling (the LM
    head's largest output)."""
    total = min(limits.max_num_batched_tokens, limits.max_num_seqs * limits.max_model_len)
    n = min(limits.max_num_seqs, total)  # so that no request exceeds max_model_len
    tables = _Tables(limits)
    seqs = []
    for i in range(n):
        length = total // n + (1 if i < total % n else 0)
        seqs.append(_seq(limits, f"profile-{i}", length, 0, tables.table(length)))
    return ScheduledBatch(seqs)


def _fits(limits: StepLimits, tokens: int, seqs: int, context: int) -> bool:
    return (
        tokens <= limits.max_num_batched_tokens
        and seqs <= limits.max_num_seqs
        and context < limits.max_model_len
    )


def _plain(limits: StepLimits, tables: _Tables) -> Iterator[ScheduledBatch]:
    for chunk in CHUNKS:
        if _fits(limits, chunk + 1, 2, SHORT_CONTEXT + chunk):
            yield ScheduledBatch([_seq(limits, "p", chunk, 0, tables.table(chunk))])
            decode_row = _seq(limits, "d", 1, 30, tables.table(31))
            prefill = _seq(limits, "p", chunk, 0, tables.table(chunk))
            yield ScheduledBatch([decode_row, prefill])
    for context in (SHORT_CONTEXT, LONG_CONTEXT):
        context = min(context, limits.max_model_len - 1)
        for batch in (1, min(limits.max_num_seqs, 64)):
            seqs = [_seq(limits, f"d{i}", 1, context, tables.table(context + 1))
                    for i in range(batch)]  # fmt: skip
            yield ScheduledBatch(seqs)


def _shared_len(n: int, block_size: int) -> int:
    """The shortest shared prefix worth cascade attention for ``n`` requests (whole blocks)."""
    shared = max(CASCADE_MIN_SHARED_TOKENS, -(-CASCADE_MIN_SAVED_TOKENS // (n - 1)))
    return -(-shared // block_size) * block_size


def _row_targets(group: int) -> list[int]:
    """Query-token counts whose shared-pass rows (tokens x GQA group) fall in each row tile of the
    split-KV kernel (16, 32, 64, 128 rows): its only cascade variants besides the decode ones."""
    counts = []
    for block_m in (16, 32, 64, 128):
        low = 1 if block_m == 16 else block_m // 2 + 1
        tokens = max(2, -(-low // group))
        if tokens * group <= block_m:
            counts.append(tokens)
    return counts


def _cascade_batch(
    limits: StepLimits, tables: _Tables, tokens: Callable[[int], int], suffix: int
) -> ScheduledBatch | None:
    """The first n (fewest requests, so the longest shared prefix) for which n requests with
    ``tokens(n)`` query tokens fit: n - 1 decode rows ``suffix`` tokens past the prefix and one
    chunk of the rest (all decode when tokens(n) == n). None: cascade cannot reach this plan."""
    for n in range(2, limits.max_num_seqs + 1):
        shared_len = _shared_len(n, limits.block_size)
        total = tokens(n)
        chunk = total - (n - 1)
        ctx = shared_len + suffix
        if chunk >= 1 and _fits(limits, total, n, ctx + chunk):
            shared = tables.table(shared_len)
            seqs = [_seq(limits, f"c{i}", 1, ctx, tables.table(ctx + 1, shared))
                    for i in range(n - 1)]  # fmt: skip
            seqs.append(_seq(limits, "cp", chunk, ctx, tables.table(ctx + chunk, shared)))
            return ScheduledBatch(seqs)
    return None


def _cascade(limits: StepLimits, tables: _Tables) -> Iterator[ScheduledBatch]:
    def decode(n: int) -> int:
        return n

    def extend(chunk: int) -> Callable[[int], int]:
        return lambda n: n - 1 + chunk

    def rows(target: int) -> Callable[[int], int]:
        return lambda n: target

    plans: list[tuple[Callable[[int], int], int]] = [(decode, 5), (decode, CASCADE_LONG_SUFFIX)]
    plans += [(extend(chunk), 5) for chunk in CHUNKS]  # the extend tiles
    plans += [(rows(target), 5) for target in _row_targets(limits.gqa_group)]
    for tokens, suffix in plans:
        batch = _cascade_batch(limits, tables, tokens, suffix)
        if batch is not None:
            yield batch


def warmup_batches(limits: StepLimits) -> list[ScheduledBatch]:
    tables = _Tables(limits)
    return [*_plain(limits, tables), *_cascade(limits, tables)]


@dataclass(frozen=True)
class WarmupReport:
    steps: int
    seconds: float  # all warm-up steps, compilation included (CUDA graphs not included)


def run_warmup(
    step: Callable[[ScheduledBatch], object],
    limits: StepLimits,
    clock: Callable[[], float] = time.perf_counter,
) -> WarmupReport:
    """Run every warm-up step through ``step`` (the runner's forward, synchronized)."""
    start = clock()
    batches = warmup_batches(limits)
    for batch in batches:
        step(batch)
    return WarmupReport(len(batches), clock() - start)
