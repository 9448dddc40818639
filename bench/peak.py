"""A CPU's peak FLOP rate for the engines' matrix work, and the rate a benchmark reached against it.

peak = FLOP per cycle and core x clock x threads (one thread per core). FLOP per cycle, per
vector or matrix unit (one multiply-add = 2 FLOP):

    float32 FMA, AVX2 (2 x 256-bit FMA pipes)                         32
    float32 FMA, AVX-512: Intel (2 x 512-bit), AMD Zen 5 (2 x 512)    64
    float32 FMA, AVX-512 on AMD Zen 4 (512-bit ops on 256-bit pipes)  32
    bf16 vdpbf16ps (AVX512_BF16): Intel, Zen 5                        128
    bf16 vdpbf16ps on Zen 4                                           64
    bf16 AMX tiles (TDPBF16PS: 16 x 16 x 32 multiply-adds / 16 cycles) 1024

The clock is the kernel's maximum frequency (cpufreq) where it is published, else the "cpu MHz"
/proc/cpuinfo reports (a VM's nominal clock): an estimate, recorded with its source. The bf16
peak applies where the CPU has bf16 units (``engine/runtime/cpu_isa.py``), the FMA peak
elsewhere; results carry both, with the table entries used.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.common import prefill_flops
from engine.runtime import cpu_isa

CPUFREQ_MAX = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
AMD_ZEN4_FAMILY, AMD_ZEN5_FAMILY = 25, 26  # AMD family 19h: Zen 3 / Zen 4 (AVX-512: Zen 4)


@dataclass(frozen=True)
class Peak:
    ghz: float
    ghz_source: str
    threads: int
    fma_flop_per_cycle: int  # float32, per core
    bf16_units: str | None  # "amx", "avx512_bf16" or None
    bf16_flop_per_cycle: int | None  # per core, where there are bf16 units

    @property
    def fma_gflops(self) -> float:
        return self.fma_flop_per_cycle * self.ghz * self.threads

    @property
    def bf16_gflops(self) -> float | None:
        per = self.bf16_flop_per_cycle
        return None if per is None else per * self.ghz * self.threads

    @property
    def gflops(self) -> float:
        """The host's peak: bf16 where it has bf16 units, else float32 FMA."""
        bf16 = self.bf16_gflops
        return self.fma_gflops if bf16 is None else bf16

    def record(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "fma_gflops": self.fma_gflops,
            "bf16_gflops": self.bf16_gflops,
            "peak_gflops": self.gflops,
        }


def _cpuinfo_field(name: str) -> str | None:
    try:
        text = cpu_isa.CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return None


def clock() -> tuple[float, str]:
    """(GHz, where it was read)."""
    try:
        return int(CPUFREQ_MAX.read_text().strip()) / 1e6, str(CPUFREQ_MAX)
    except (OSError, ValueError):
        pass
    mhz = _cpuinfo_field("cpu MHz")
    return (float(mhz) / 1e3, "/proc/cpuinfo cpu MHz") if mhz else (0.0, "unknown")


def flop_per_cycle(flags: frozenset[str], vendor: str, family: int) -> tuple[int, int | None]:
    """(float32 FMA, bf16) FLOP per cycle and core for these flags (module docstring)."""
    zen4 = vendor == "AuthenticAMD" and family == AMD_ZEN4_FAMILY
    avx512 = set(cpu_isa.AVX512_CORE) <= flags
    fma = (32 if zen4 else 64) if avx512 else 32
    units = cpu_isa.bf16_units(flags)
    bf16 = {"amx": 1024, "avx512_bf16": 64 if zen4 else 128}.get(units or "")
    return fma, bf16


def host_peak(threads: int) -> Peak:
    flags = cpu_isa.cpu_flags()
    family = _cpuinfo_field("cpu family") or "0"
    fma, bf16 = flop_per_cycle(flags, _cpuinfo_field("vendor_id") or "", int(family))
    ghz, source = clock()
    units = cpu_isa.native_bf16()
    return Peak(ghz, source, threads, fma, units, bf16 if units else None)


def workload_flops(workload: dict[str, Any], layers: int) -> float:
    """The FLOPs a workload needs (bench/common.py's model): its ``shared`` prefix once (none
    where it was computed before: ``warm``), then every prompt's own tokens attending to it, one
    sampled row each. A side that computes the shared prefix once per prompt does more."""
    shared: int = workload["shared"]
    flops = 0.0 if workload["warm"] else prefill_flops(0, shared, layers, sampled=0)
    return flops + sum(prefill_flops(shared, len(p), layers) for p in workload["prompts"])


def rates(
    seconds: dict[str, dict[str, float]], flops: dict[str, float], peak: Peak
) -> dict[str, dict[str, float]]:
    """Per workload: GFLOP/s at the median time and its share of the host's peak."""
    out = {}
    for name, s in seconds.items():
        gflops = flops[name] / s["median"] / 1e9
        out[name] = {"gflops": gflops, "of_peak": gflops / peak.gflops if peak.gflops else 0.0}
    return out
