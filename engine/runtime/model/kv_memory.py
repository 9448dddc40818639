"""Sizing and allocation of the paged KV cache from a memory budget.

Per layer: ``k, v = [num_blocks, block_size, num_kv_heads, head_dim]`` (views of one tensor).
Budget: ``EngineConfig.kv_cache_bytes`` when set. Otherwise on CUDA, profiled (as vLLM does):
after the weights are loaded the runner runs one step of the largest size the scheduler can
produce, and the KV cache gets what is left of ``gpu_memory_utilization`` x device memory::

    total x utilization  =  non-torch use (CUDA context, other processes)
                          + torch peak of load + profile step (weights, activations, logits)
                          - the profile step's own small KV cache
                          + KV cache                                          <- solved for

CUDA graphs are captured after the KV cache exists; their pools come out of the remaining
(1 - utilization) headroom. On the CPU: ``kv_cache_memory_fraction`` of available RAM, capped at
CPU_KV_CAP_BYTES so a laptop run does not claim most of the machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from engine.config import EngineConfig
from engine.runtime.model.config import ModelConfig

CPU_KV_CAP_BYTES = 2 << 30


def available_cpu_bytes() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def block_bytes(model: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of K + V of one block across all layers."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * model.num_layers * block_size * model.kv_size * elem


def kv_budget_bytes(config: EngineConfig, device: torch.device) -> int:
    """The budget without profiling: explicit bytes, or the CPU share of available RAM (CUDA
    devices are sized by :func:`profiled_kv_bytes` instead)."""
    if config.kv_cache_bytes is not None:
        return config.kv_cache_bytes
    return min(int(available_cpu_bytes() * config.kv_cache_memory_fraction), CPU_KV_CAP_BYTES)


@dataclass(frozen=True)
class MemoryReading:
    """Device memory right after the profile step, in bytes."""

    total: int  # the device's memory
    free: int  # free on the device now (every process counted)
    torch_reserved: int  # held by this process's caching allocator now
    torch_peak: int  # peak bytes of live torch tensors since before loading the weights
    profile_kv: int  # the profile step's temporary KV cache (counted in torch_peak)

    @property
    def non_torch(self) -> int:
        """CUDA context, libraries and other processes: used on the device, not by our tensors."""
        return max(0, self.total - self.free - self.torch_reserved)

    @property
    def needed(self) -> int:
        """Everything but the KV cache at the step of maximum size."""
        return self.non_torch + self.torch_peak - self.profile_kv


def read_cuda_memory(device: torch.device, profile_kv: int) -> MemoryReading:
    free, total = torch.cuda.mem_get_info(device)
    return MemoryReading(
        total=total,
        free=free,
        torch_reserved=torch.cuda.memory_reserved(device),
        torch_peak=torch.cuda.max_memory_allocated(device),
        profile_kv=profile_kv,
    )


def profiled_kv_bytes(reading: MemoryReading, utilization: float) -> int:
    """KV bytes that keep the process within ``utilization`` of the device (may be <= 0)."""
    return int(reading.total * utilization) - reading.needed


def allocate_kv_caches(
    model: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    # Zero-filled: padded block-table entries point at block 0, and masked-out keys must still
    # hold finite values (0 * NaN would leak into the attention output).
    shape = (model.num_layers, 2, num_blocks, block_size, model.num_kv_heads, model.head_dim)
    pool = torch.zeros(shape, dtype=dtype, device=device)
    return [(pool[i, 0], pool[i, 1]) for i in range(model.num_layers)]
