"""All decoder layers of a CPU forward in one C call (``engine/runtime/kernels/cpu/layers.c``)
give the bits the per-op loop gives (same kernels, same order), for prefill chunks, decode rows
and both in one batch, with biases (Qwen2) and without (Llama), in Q4_1 and Q8_0 blocks, with
float32, int16 and int8 activations; the loop is used only where every layer is in blocks; the C
SiLU(gate) * up agrees with torch's.
CI runs this file under ``KVGATE_CPU_ISA=avx2`` as well."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engine.core.batch import ScheduledSeq
from engine.runtime import kernels
from engine.runtime.kernels.cpu import ops, qgemm
from engine.runtime.model.linear import Linear
from engine.runtime.runner import ModelRunner
from tests.engine.model.factories import blocks, logits_of, make_hf_model, random_prompt, seq
from tests.engine.model.gguf_factory import write_gguf
from tests.engine.model.test_gguf_parity import gguf_runner

# (architecture, GGUF type, EngineConfig.weights: float32, int16 or int8 activations)
CASES = {
    "qwen2-q4_1": ("qwen2", "Q4_1", "auto"),
    "llama-q8_0": ("llama", "Q8_0", "auto"),
    "qwen2-q4_1-int8": ("qwen2", "Q4_1", "blocks-int8"),
    "llama-q8_0-int8": ("llama", "Q8_0", "blocks-int8"),
    "llama-q4_1-int16": ("llama", "Q4_1", "blocks-int16"),
    "qwen2-q8_0-int16": ("qwen2", "Q8_0", "blocks-int16"),
}
SUFFIX = {"auto": "", "blocks-int8": "/int8", "blocks-int16": "/int16"}  # of Linear's kind
BLOCK = 4


@pytest.fixture(scope="module", params=list(CASES))
def runner(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ModelRunner:
    if qgemm.load() is None or ops.default() is None:
        pytest.skip("no C kernels on this machine")
    arch, qtype, weights = CASES[request.param]
    tmp: Path = tmp_path_factory.mktemp(request.param)
    _, source = make_hf_model(tmp / "hf", arch, hidden=64, intermediate=128, layers=3)
    path = write_gguf(tmp / "model.gguf", source, qtype)
    built = gguf_runner(path, BLOCK, num_blocks=96, weights=weights)
    kinds = {w.blocks.kind for w in _linears(built) if w.blocks is not None}
    assert kinds == {qtype.lower() + SUFFIX[weights]}
    return built


def _linears(runner: ModelRunner) -> list[Linear]:
    decoder = runner.decoder
    layers = decoder.layers
    return [decoder.lm_head, *(w for x in layers for w in (x.qkv, x.o_proj, x.gate_up, x.down))]


def _both(runner: ModelRunner, *seqs: ScheduledSeq) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits of one batch through the fused layers, then through the per-op loop (each
    writes the same K/V into the same slots)."""
    decoder = runner.decoder
    fused = decoder.fused
    assert fused is not None
    got = logits_of(runner, *seqs)
    decoder.fused = None
    try:
        want = logits_of(runner, *seqs)
    finally:
        decoder.fused = fused
    return got, want


def test_prefill_decode_and_mixed_batches_give_the_per_op_bits(runner: ModelRunner) -> None:
    a, b = random_prompt(23, seed=1), random_prompt(9, seed=2)
    ta, tb = blocks(0, 40, BLOCK), blocks(20, 40, BLOCK)
    got, want = _both(runner, seq("a", a, 0, ta), seq("b", b[:5], 0, tb))  # two prefill chunks
    assert want.abs().max().item() > 1e-2 and torch.equal(got, want)
    # b's second chunk beside a's decode row, then decode rows alone
    got, want = _both(runner, seq("a", [a[0]], 23, ta), seq("b", b[5:], 5, tb))
    assert torch.equal(got, want)
    for step in range(3):
        rows = (seq("a", [a[step]], 24 + step, ta), seq("b", [b[step]], 9 + step, tb))
        got, want = _both(runner, *rows)
        assert torch.equal(got, want), step


def test_the_loop_runs_only_where_every_layer_is_in_blocks(tmp_path: Path) -> None:
    _, source = make_hf_model(tmp_path / "hf", "llama", layers=1)
    plain = gguf_runner(write_gguf(tmp_path / "f32.gguf", source, "F32"), BLOCK, 16)
    assert plain.decoder.fused is None
    if qgemm.load() is None or ops.default() is None:
        pytest.skip("no C kernels on this machine")
    blocked = gguf_runner(write_gguf(tmp_path / "q8.gguf", source, "Q8_0"), BLOCK, 16)
    assert blocked.decoder.fused is not None


def test_c_silu_mul_agrees_with_torch() -> None:
    c = ops.default()
    if c is None:
        pytest.skip("no C ops on this machine")
    gate_up = torch.randn(5, 2 * 48, generator=torch.Generator().manual_seed(0)) * 6
    gate, up = gate_up.split(48, dim=-1)
    want = F.silu(gate) * up
    got = c.silu_mul(gate_up, 48)
    assert got.shape == (5, 48)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(kernels.silu_mul(gate_up.clone(), 48), want, rtol=1e-6, atol=1e-6)
    # not float32: torch's SiLU
    half = kernels.silu_mul(gate_up.double(), 48)
    assert half.dtype == torch.float64
    torch.testing.assert_close(half, want.double(), rtol=1e-6, atol=1e-6)


def test_c_silu_mul_holds_where_exp_overflows() -> None:
    """Past float32 exp's range silu(g) is g (large g) or about 0 (exp(-g) overflows)."""
    c = ops.default()
    if c is None:
        pytest.skip("no C ops on this machine")
    gate = torch.linspace(-120.0, 120.0, 2401)
    got = c.silu_mul(torch.cat([gate, torch.ones_like(gate)]).view(1, -1), gate.numel())[0]
    exact = gate.double() * torch.sigmoid(gate.double())
    torch.testing.assert_close(got.double(), exact, rtol=4e-7, atol=1e-30)
    assert torch.isfinite(got).all()
