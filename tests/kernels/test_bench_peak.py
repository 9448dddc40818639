"""``bench/peak.py``: the host peak that ``kvgate bench vllm`` reports FLOP rates against, and
the FLOPs it counts per workload."""

from __future__ import annotations

from bench.common import prefill_flops
from bench.peak import Peak, flop_per_cycle, host_peak, rates, workload_flops
from engine.runtime import cpu_isa

AVX512 = frozenset(cpu_isa.AVX512_CORE) | {"avx2", "fma"}


def test_flop_per_cycle_per_unit_and_microarchitecture() -> None:
    assert flop_per_cycle(frozenset({"avx2", "fma"}), "AuthenticAMD", 25) == (32, None)
    zen4 = AVX512 | {"avx512_bf16"}
    assert flop_per_cycle(zen4, "AuthenticAMD", 25) == (32, 64)  # 512-bit ops on 256-bit pipes
    assert flop_per_cycle(zen4, "AuthenticAMD", 26) == (64, 128)  # Zen 5
    amx = zen4 | {"amx_tile", "amx_bf16"}
    assert flop_per_cycle(amx, "GenuineIntel", 6) == (64, 1024)
    assert flop_per_cycle(AVX512, "GenuineIntel", 6) == (64, None)


def test_the_peak_is_bf16_where_there_are_units_else_fma() -> None:
    fma_only = fma_only_peak()
    assert fma_only.gflops == fma_only.fma_gflops == 128.0
    amx = Peak(2.0, "test", 2, 64, "amx", 1024)
    assert amx.gflops == amx.bf16_gflops == 4096.0 and amx.record()["fma_gflops"] == 256.0
    here = host_peak(2)
    assert (here.bf16_units is None) == (cpu_isa.native_bf16() is None)
    assert here.threads == 2 and here.gflops >= 0.0


def test_a_workload_counts_its_shared_prefix_once_and_none_when_warm() -> None:
    prompts = [[1] * 384, [1] * 384]
    cold = {"shared": 128, "warm": None, "prompts": prompts}
    warm = {"shared": 128, "warm": [1] * 128, "prompts": prompts}
    own = 2 * prefill_flops(128, 384, 4)
    assert workload_flops(warm, 4) == own
    assert workload_flops(cold, 4) == own + prefill_flops(0, 128, 4, sampled=0)
    alone = {"shared": 0, "warm": None, "prompts": prompts[:1]}
    assert workload_flops(alone, 4) == prefill_flops(0, 384, 4)
    got = rates({"w": {"median": 0.5, "min": 0.4, "max": 0.6}}, {"w": 1e11}, fma_only_peak())
    assert got == {"w": {"gflops": 200.0, "of_peak": 200.0 / 128.0}}


def fma_only_peak() -> Peak:
    return Peak(2.0, "test", 2, 32, None, None)
