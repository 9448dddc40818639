"""Logit bias tensors: built once per request (shared by the choices of one request), the same
biased logits as adding each (token, bias) pair in turn, in any chunk of rows, step after step."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

import numpy as np
import torch

from engine.params import SamplingParams
from engine.runtime.logit_bias import LogitBiasTable
from engine.runtime.sampling import Sampler, sample

CPU = torch.device("cpu")


class CountingBias(tuple):  # type: ignore[type-arg]
    """A logit_bias tuple that counts how often it is read through."""

    reads = 0

    def __iter__(self) -> Iterator[tuple[int, float]]:
        type(self).reads += 1
        return super().__iter__()


def _reference(x: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Each row's pairs added one by one in float32 (a token listed twice gets both)."""
    out = x.clone()
    for i, p in enumerate(params):
        for tok, bias in p.logit_bias:
            out[i, tok] += torch.tensor(bias, dtype=torch.float32)
    return out


def _sequential(x: torch.Tensor, rows: list[int], tokens: list[int], values: list[float]):
    """numpy's unbuffered add: float32 additions one by one, in the order given."""
    out = x.numpy().copy()
    np.add.at(out, (np.array(rows), np.array(tokens)), np.array(values, dtype=np.float32))
    return torch.from_numpy(out)


def _logits(rows: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def _batch(vocab: int) -> tuple[list[str], list[SamplingParams]]:
    """r0 and r2 are two choices of one request (one tuple); r1 has none; r3 lists 5 twice."""
    shared = ((1, 2.5), (vocab - 1, -1.25), (7, 0.1))
    params = [
        SamplingParams(temperature=0.0, logit_bias=shared),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0, seed=3, logit_bias=shared),
        SamplingParams(temperature=0.0, logit_bias=((5, 1.5), (9, -3.0), (5, 0.75))),
    ]
    return ["r0", "r1", "r2", "r3"], params


def test_bias_equals_adding_each_pair_in_turn_in_any_chunk_of_rows() -> None:
    vocab = 50
    ids, params = _batch(vocab)
    x = _logits(4, vocab)
    entries = LogitBiasTable().entries(ids, params, vocab, CPU)
    assert entries is not None and entries.row_ids == (0, 2, 3)
    want = _reference(x, params)
    assert torch.equal(entries.apply(x), want)
    for start, stop in [(0, 1), (1, 3), (2, 4), (3, 4), (0, 4)]:
        part = entries.rows_of(start, stop)
        got = x[start:stop] if part is None else part.apply(x[start:stop])
        assert torch.equal(got, want[start:stop]), (start, stop)
    assert entries.rows_of(1, 2) is None  # r1 alone: nothing to add


def test_bias_is_built_once_per_request_not_per_step() -> None:
    vocab = 40
    table = LogitBiasTable()
    shared = CountingBias(((3, 4.0), (8, -2.0)))
    own = CountingBias(((11, 1.0),))
    params = [SamplingParams(logit_bias=shared)] * 2 + [SamplingParams(logit_bias=own)]
    params.append(SamplingParams())
    ids = ["a", "a-1", "b", "c"]  # a and a-1: two choices of one request
    x = _logits(4, vocab, seed=1)
    want = _reference(x, params)
    for step in range(6):
        entries = table.entries(ids, params, vocab, CPU)
        assert entries is not None and torch.equal(entries.apply(x), want)
        if step == 0:
            reads_after_first_step = CountingBias.reads
    assert CountingBias.reads == reads_after_first_step  # no step after the first reads a pair
    assert table.builds == 2 and len(table) == 3


def test_a_reused_request_id_or_a_request_coming_back_gets_its_own_bias() -> None:
    vocab = 30
    table = LogitBiasTable()
    x = _logits(1, vocab, seed=2)
    first = [SamplingParams(logit_bias=((4, 9.0),))]
    table.entries(["r"], first, vocab, CPU)
    second = [SamplingParams(logit_bias=((6, 9.0),))]  # a new request under the same id
    entries = table.entries(["r"], second, vocab, CPU)
    assert entries is not None and torch.equal(entries.apply(x), _reference(x, second))
    assert table.entries(["other"], [SamplingParams()], vocab, CPU) is None and len(table) == 0
    table.entries(["r"], second, vocab, CPU)  # back after a step without it (a preemption)
    assert table.builds == 3


def test_sampler_tokens_follow_the_biased_logits_over_steps_and_cpu_chunks() -> None:
    vocab = 1 << 17  # the CPU samples 4 rows of this vocabulary at a time: 3 chunks of 9 rows
    base_ids, base = _batch(vocab)
    ids = base_ids + [f"{rid}-again" for rid in base_ids] + ["last"]
    params = base + base + [replace(base[0], logit_bias=((12, 30.0),))]
    sampler = Sampler()
    for step in range(3):
        x = _logits(len(params), vocab, seed=10 + step)
        got = sampler(x, params, [step] * len(params), None, ids).tokens
        unbiased = [replace(p, logit_bias=()) for p in params]
        want = sample(_reference(x, params), unbiased, [step] * len(params)).tokens
        assert got == want, step
    assert sampler.bias.builds == 3  # r0's tuple (r2's and both agains' too), r3's, last's


def test_sampler_reads_a_request_bias_only_at_its_first_step() -> None:
    vocab = 64
    bias = CountingBias(tuple((t, 0.5) for t in range(0, vocab, 2)))
    params = [SamplingParams(temperature=1.0, seed=s, logit_bias=bias) for s in range(8)]
    ids = [f"choice-{i}" for i in range(8)]  # the 8 choices of one request
    sampler = Sampler()
    reads = []
    for step in range(5):
        sampler(_logits(8, vocab, seed=step), params, [step] * 8, None, ids)
        reads.append(CountingBias.reads)
    assert reads[1:] == [reads[0]] * 4, reads


def test_a_long_bias_with_repeated_tokens_gives_the_same_bits_on_any_thread_count() -> None:
    """Past torch's grain size, ``index_put(accumulate=True)`` adds from several threads, so a
    repeated token's additions land in any order; the bias must not depend on that."""
    vocab, entries = 64, 40_000
    gen = torch.Generator().manual_seed(5)
    pairs = [
        tuple(zip(torch.randint(0, 16, (entries,), generator=gen).tolist(),
                  (torch.randn(entries, generator=gen) * 3).tolist(), strict=True))
        for _ in range(2)
    ]  # fmt: skip
    params = [SamplingParams(logit_bias=pairs[0]), SamplingParams(logit_bias=pairs[1])]
    x = _logits(2, vocab, seed=6)
    want = _sequential(
        x, [0] * entries + [1] * entries, [t for p in pairs for t, _ in p],
        [b for p in pairs for _, b in p],
    )  # fmt: skip
    before = torch.get_num_threads()
    try:
        for threads in (1, 3, 4):
            torch.set_num_threads(threads)
            for _ in range(3):
                entries_ = LogitBiasTable().entries(["a", "b"], params, vocab, CPU)
                assert entries_ is not None and torch.equal(entries_.apply(x), want), threads
    finally:
        torch.set_num_threads(before)


def test_a_step_with_the_same_biased_rows_reuses_the_concatenation() -> None:
    vocab = 32
    table = LogitBiasTable()
    ids, params = _batch(vocab)
    first = table.entries(ids, params, vocab, CPU)
    assert table.entries(ids, params, vocab, CPU) is first
    moved = table.entries(ids[1:], params[1:], vocab, CPU)  # r0 left: the rows moved up
    assert moved is not first and moved is not None and moved.row_ids == (1, 2)
    x = _logits(3, vocab, seed=7)
    assert torch.equal(moved.apply(x), _reference(x, params[1:]))
