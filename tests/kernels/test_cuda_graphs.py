"""Decode CUDA graphs as plain logic: buckets, static-buffer filling, and replay through a
stand-in capture (re-running the recorded forward on the static buffers, as a graph replays its
kernels) matching the eager forward, with the padding rows inert."""

from __future__ import annotations

import pytest
import torch

from engine.core.batch import ScheduledBatch, ScheduledSeq
from engine.params import SamplingParams
from engine.runtime.cuda_graphs import (
    DecodeGraphs,
    StaticInputs,
    graph_buckets,
    is_graph_step,
    pick_bucket,
)
from engine.runtime.model.inputs import build_step_inputs
from tests.kernels.engine_fixtures import route_to_triton, triton_runner

GREEDY = SamplingParams(temperature=0.0)


def _seq(rid: str, tokens: list[int], start: int, table: list[int], sample: bool = True):
    return ScheduledSeq(rid, tokens, start, table, sample, GREEDY)


def test_buckets_and_their_choice():
    assert graph_buckets(256) == (1, 2, 4, 8, *range(16, 257, 16))
    assert graph_buckets(100)[-2:] == (96, 100)
    assert graph_buckets(3) == (1, 2, 3)
    buckets = graph_buckets(40)
    assert [pick_bucket(buckets, n) for n in (1, 3, 5, 9, 17, 33, 40, 41)] == [
        1, 4, 8, 16, 32, 40, 40, None,
    ]  # fmt: skip


def test_only_plain_decode_steps_use_graphs():
    cpu = torch.device("cpu")
    decode = ScheduledBatch([_seq("a", [5], 7, [0]), _seq("b", [6], 3, [1])])
    mixed = ScheduledBatch([_seq("a", [5], 7, [0]), _seq("b", [6, 7], 3, [1])])
    not_sampled = ScheduledBatch([_seq("a", [5], 7, [0], sample=False)])
    assert is_graph_step(build_step_inputs(decode, 16, 4, 64, cpu))
    assert not is_graph_step(build_step_inputs(mixed, 16, 4, 64, cpu))
    assert not is_graph_step(build_step_inputs(not_sampled, 16, 4, 64, cpu))
    shared = list(range(17))  # 17 blocks x 16 tokens shared by 17 requests: cascade pays
    cascade = ScheduledBatch([_seq(f"r{i}", [5], 280, [*shared, 17 + i]) for i in range(17)])
    assert not is_graph_step(build_step_inputs(cascade, 16, 64, 512, cpu))


def test_static_buffers_take_the_step_and_pad_the_bucket():
    cpu = torch.device("cpu")
    static = StaticInputs.allocate(8, max_model_len=64, block_size=4, device=cpu)
    batch = ScheduledBatch([_seq("a", [5], 6, [3, 1]), _seq("b", [9], 9, [2, 0, 4])])
    inputs = build_step_inputs(batch, 4, 8, 64, cpu)
    static.input_ids[:4] = 77  # stale values of an earlier, larger step
    static.fill(inputs, bucket=4)
    assert static.input_ids[:4].tolist() == [5, 9, 0, 0]
    assert static.positions[:4].tolist() == [6, 9, 0, 0]
    assert static.slot_mapping[:4].tolist() == [1 * 4 + 2, 4 * 4 + 1, -1, -1]
    assert static.seq_lens[:4].tolist() == [7, 10, 1, 1]
    assert static.context_lens[:4].tolist() == [6, 9, 0, 0]
    assert static.block_tables[:2, :3].tolist() == [[3, 1, 0], [2, 0, 4]]
    assert static.block_tables[2:4, 0].tolist() == [0, 0]
    meta = static.meta(4)
    assert meta.query_start_loc.tolist() == [0, 1, 2, 3, 4] and meta.checked
    assert meta.max_seq_len == 64 and meta.block_tables.shape == (4, 16)
    assert static.logits_indices[:4].tolist() == [0, 1, 2, 3]


class _Replay:
    """Stand-in for a CUDA graph: replay re-runs the recorded forward into the same output."""

    def __init__(self, fn, out: torch.Tensor) -> None:
        self.fn, self.out = fn, out

    def replay(self) -> None:
        with torch.inference_mode():  # the output was made by the decoder's inference mode
            self.out.copy_(self.fn())


def _capture(fn):
    out = fn()
    return _Replay(fn, out), out


def _replay_vs_eager(runner) -> None:
    """Prefill three requests, then one decode step replayed from the bucket-4 graph (one padding
    row) and the same step eagerly from the same cache: equal logits and equal caches."""
    graphs = runner.graphs
    assert isinstance(graphs, DecodeGraphs) and graphs.buckets == (1, 2, 4)
    graphs.check_integrity()
    prompts = {"a": ([11, 12, 13, 14, 15], [0, 1, 2]), "b": ([21, 22], [3, 4]),
               "c": ([31, 32, 33, 34, 35, 36, 37], [5, 6, 7])}  # fmt: skip
    runner.compute_logits(ScheduledBatch([_seq(r, t, 0, tab) for r, (t, tab) in prompts.items()]))
    assert graphs.replays == 0  # not a decode step: eager
    decode = ScheduledBatch([_seq(r, [40 + i], len(t), tab)
                             for i, (r, (t, tab)) in enumerate(prompts.items())])  # fmt: skip
    caches = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
    _, replayed = runner.compute_logits(decode)
    replayed = replayed.clone()
    assert graphs.replays == 1 and replayed.shape[0] == 3
    after_graph = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
    for (k, v), (k0, v0) in zip(runner.kv_caches, caches, strict=True):
        k.copy_(k0)
        v.copy_(v0)
    runner.graphs = None
    _, eager = runner.compute_logits(decode)
    torch.testing.assert_close(replayed, eager, atol=1e-5, rtol=1e-5)
    for (k, v), (kg, vg) in zip(runner.kv_caches, after_graph, strict=True):
        assert torch.equal(k, kg) and torch.equal(v, vg)  # padding rows wrote nothing


def test_replayed_decode_matches_eager(monkeypatch: pytest.MonkeyPatch):
    route_to_triton(monkeypatch)
    runner = triton_runner(num_blocks=32, block_size=4, max_num_seqs=4)
    runner.capture_graphs(_capture)
    _replay_vs_eager(runner)


@pytest.mark.gpu
def test_captured_cuda_graph_matches_eager():
    runner = triton_runner(num_blocks=32, block_size=4, max_num_seqs=4)
    runner.capture_graphs()  # torch.cuda.graph
    _replay_vs_eager(runner)
