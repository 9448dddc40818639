"""Frozen engine configuration. Values measured at run time (number of KV blocks) live elsewhere."""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_BLOCK_SIZE = 64
WEIGHTS = ("auto", "blocks-int16", "blocks-int8", "dequantized")  # EngineConfig.weights
DTYPES = ("auto", "float32", "bfloat16", "float16")  # EngineConfig.dtype and kv_dtype


@dataclass(frozen=True)
class EngineConfig:
    block_size: int = 16
    enable_prefix_reuse: bool = True
    max_num_batched_tokens: int = 8192  # token budget of one step (decode + prefill chunks)
    max_num_seqs: int = 256  # cap on running requests
    # fair: per-tenant virtual token counters (engine/core/fairness.py); fcfs: arrival order
    scheduling: str = "fair"
    fair_prefill_tokens: int = 256  # step's prefill budget for others while one is under-served
    # others' decode rows in a step while one is under-served; None: not capped (a shorter step
    # for the waiting tenant, paid by the others' decodes waiting a step: off by default)
    fair_decode_rows: int | None = None
    batch_max_wait_steps: int = (
        64  # a batch request waiting this many steps competes as interactive
    )
    max_waiting: int = 1024  # bounded waiting queue; beyond it requests are refused as overloaded
    kv_cache_bytes: int | None = None  # explicit KV budget; None: derived from device memory
    kv_cache_memory_fraction: float = 0.5  # CPU: share of available RAM (kv_cache_bytes None)
    gpu_memory_utilization: float = 0.9  # CUDA: device share for weights + activations + KV
    cuda_graphs: bool = True  # CUDA: replay decode steps from graphs captured per batch bucket
    pin_cap_fraction: float = 0.5  # pinned blocks may take at most this share of the pool
    host_kv_bytes: int = 0  # host-memory KV tier (engine/core/kv/host_tier.py); 0: no host tier
    host_offload_priority: int = 20  # evicted blocks at or above it go to the host tier
    kv_snapshot_dir: str | None = None  # pinned prompts' KV saved here, restored at start
    # the snapshots' MAC key (engine/runtime/snapshot_key.py); None: <kv_snapshot_dir>/snapshot.key
    kv_snapshot_key: str | None = field(default=None, repr=False)
    # auto: CUDA bfloat16 (float16 before Ampere); CPU bfloat16 where it has bf16 matrix units
    # (AMX-BF16, AVX512_BF16), else float32; a GGUF's blocks keep their kernels
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    # the KV cache's dtype, and with it attention's, the norms' and the residual stream's (the
    # linears compute in ``dtype``); auto: float32 on the CPU (kvgate's C kernels) whatever
    # ``dtype`` is, ``dtype`` on CUDA. float32 beside half weights is a CPU choice only.
    kv_dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    # auto: a GGUF's Q4_1 / Q8_0 matrices stay in their blocks where the CPU block GEMM runs
    # (engine/runtime/model/blocks.py), float32 activations; blocks-int16 / blocks-int8: the
    # same blocks with activations rounded to int16 / int8 (as llama.cpp does) per block of 32
    # (engine/runtime/kernels/cpu/q8gemm.c); dequantized: every weight in ``dtype``
    weights: str = "auto"
    device: str = "auto"  # auto | cpu | cuda | cuda:N

    def __post_init__(self) -> None:
        bs = self.block_size
        if bs < 1 or bs > MAX_BLOCK_SIZE or bs & (bs - 1):
            raise ValueError(f"block_size must be a power of two in 1..{MAX_BLOCK_SIZE}, got {bs}")
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1 or self.max_waiting < 0:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be >= 1")
        if self.scheduling not in ("fair", "fcfs"):
            raise ValueError(f"scheduling must be fair or fcfs, got {self.scheduling!r}")
        if self.fair_prefill_tokens < 1 or self.batch_max_wait_steps < 0:
            raise ValueError("fair_prefill_tokens must be >= 1, batch_max_wait_steps >= 0")
        if self.fair_decode_rows is not None and self.fair_decode_rows < 0:
            raise ValueError(f"fair_decode_rows must be >= 0, got {self.fair_decode_rows}")
        if not 0.0 <= self.pin_cap_fraction <= 1.0:
            raise ValueError(f"pin_cap_fraction must be in [0, 1], got {self.pin_cap_fraction}")
        if self.host_kv_bytes < 0 or not 0 <= self.host_offload_priority <= 100:
            raise ValueError("host_kv_bytes must be >= 0, host_offload_priority in 0..100")
        if self.weights not in WEIGHTS:
            raise ValueError(f"weights must be one of {', '.join(WEIGHTS)}, got {self.weights!r}")
        if not 0.0 < self.kv_cache_memory_fraction <= 1.0:
            raise ValueError("kv_cache_memory_fraction must be in (0, 1]")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        for name in ("dtype", "kv_dtype"):
            value = getattr(self, name)
            if value not in DTYPES:
                raise ValueError(f"{name} must be {', '.join(DTYPES[:-1])} or float16, got {value}")
