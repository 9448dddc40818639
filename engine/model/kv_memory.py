"""Sizing and allocation of the paged KV cache from a memory budget.

Per layer: ``k, v = [num_blocks, block_size, num_kv_heads, head_dim]`` (views of one tensor).
Budget: ``EngineConfig.kv_cache_bytes`` when set; otherwise ``kv_cache_memory_fraction`` of free
device memory (CUDA: after the weights are loaded; CPU: available RAM, capped at CPU_KV_CAP_BYTES
so a laptop run does not claim most of the machine).
"""

from __future__ import annotations

import os

import torch

from engine.config import EngineConfig
from engine.model.config import ModelConfig

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
    if config.kv_cache_bytes is not None:
        return config.kv_cache_bytes
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * config.kv_cache_memory_fraction)
    return min(int(available_cpu_bytes() * config.kv_cache_memory_fraction), CPU_KV_CAP_BYTES)


def allocate_kv_caches(
    model: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    # Zero-filled: padded block-table entries point at block 0, and masked-out keys must still
    # hold finite values (0 * NaN would leak into the attention output).
    shape = (model.num_layers, 2, num_blocks, block_size, model.num_kv_heads, model.head_dim)
    pool = torch.zeros(shape, dtype=dtype, device=device)
    return [(pool[i, 0], pool[i, 1]) for i in range(model.num_layers)]
