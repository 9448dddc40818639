"""Frozen engine configuration. Values measured at run time (number of KV blocks) live elsewhere.

Every knob is declared once, here: its type, default and meaning (``help`` in the field's
metadata), checked once by ``__post_init__`` (``ConfigFieldError`` names the field). The gateway's
settings (gateway/settings.py) make each field a ``KVGATE_<FIELD>`` variable from this
declaration: the variable's parser follows the field's type, its default is the field's, and
its value is checked here, never twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MAX_BLOCK_SIZE = 64
WEIGHTS = ("auto", "blocks-int16", "blocks-int8", "dequantized")  # EngineConfig.weights
DTYPES = ("auto", "float32", "bfloat16", "float16")  # EngineConfig.dtype and kv_dtype
SCHEDULING = ("fair", "fcfs")
SNAPSHOT_KEY_MIN = 32  # characters of an explicit snapshot MAC key


class ConfigFieldError(ValueError):
    """A value ``EngineConfig`` refuses: ``field`` names it, the message says why."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field} {problem}")
        self.field = field
        self.problem = problem


def knob(default: Any, help: str, *, secret: bool = False) -> Any:
    """A field of ``EngineConfig`` with its meaning (a secret is never shown: ``repr=False``)."""
    return field(default=default, metadata={"help": help}, repr=not secret)


@dataclass(frozen=True)
class EngineConfig:
    block_size: int = knob(16, "KV cache block size (tokens): a power of two up to 64")
    enable_prefix_reuse: bool = knob(True, "serve prompt prefixes from the KV cache")
    max_num_batched_tokens: int = knob(
        8192, "token budget of one engine step (decode rows and prefill chunks)"
    )
    max_num_seqs: int = knob(256, "most requests running at once")
    scheduling: str = knob(
        "fair", "fair: per-tenant virtual token counters (weights); fcfs: arrival order"
    )
    fair_prefill_tokens: int = knob(
        256, "fair scheduling: a step's prefill budget for others while one tenant is behind"
    )
    fair_decode_rows: int | None = knob(
        None,
        "fair scheduling: others' decode rows in a step while one tenant is behind; "
        "unset: not capped",
    )
    batch_max_wait_steps: int = knob(
        64, "a batch-priority request waiting this many steps competes as interactive"
    )
    max_waiting: int = knob(
        1024, "bounded waiting queue; beyond it requests are refused as overloaded"
    )
    kv_cache_bytes: int | None = knob(None, "KV cache budget; unset: from device memory")
    kv_cache_memory_fraction: float = knob(
        0.5, "CPU, KV cache budget unset: share of available memory for the KV cache"
    )
    gpu_memory_utilization: float = knob(
        0.9, "CUDA: share of GPU memory for weights, activations and the KV cache"
    )
    cuda_graphs: bool = knob(True, "CUDA: replay decode steps from CUDA graphs")
    pin_cap_fraction: float = knob(0.5, "share of KV blocks pinned prompts may take")
    host_kv_bytes: int = knob(0, "host-memory KV tier (pinned memory on CUDA); 0: none")
    host_offload_priority: int = knob(
        20, "blocks evicted at or above this retention priority go to the host tier"
    )
    kv_snapshot_dir: str | None = knob(
        None, "pinned prompts' KV saved here and restored at start; unset: none"
    )
    kv_snapshot_key: str | None = knob(
        None,
        f"secret key of the snapshots' MAC (>= {SNAPSHOT_KEY_MIN} characters; workers sharing "
        "a snapshot directory share it); unset: generated once into <snapshot dir>/snapshot.key "
        "(0600)",
        secret=True,
    )
    dtype: str = knob(
        "auto",
        "the linears' dtype: auto (CUDA: bfloat16, float16 before Ampere; CPU: bfloat16 where "
        "it has bf16 matrix units, AMX-BF16 or AVX512_BF16, else float32; a GGUF's blocks keep "
        "their kernels), float32, bfloat16, float16",
    )
    kv_dtype: str = knob(
        "auto",
        "the KV cache's dtype, and with it attention's, the norms' and the residual stream's: "
        "auto (CPU: float32, kvgate's C kernels, whatever dtype is; CUDA: dtype), float32, "
        "bfloat16, float16",
    )
    weights: str = knob(
        "auto",
        "auto: a GGUF's Q4_1 / Q8_0 weights stay in their blocks on the CPU (kvgate's block "
        "GEMM, float32 activations); blocks-int16: the same blocks with activations rounded to "
        "int16 per block of 32 (faster, within the float32 path's tolerance on the default "
        "model); blocks-int8: rounded to int8, as llama.cpp does (fastest, least exact); "
        "dequantized: every weight in the engine dtype",
    )
    device: str = knob("auto", "engine device: auto, cpu, cuda, cuda:N")

    def __post_init__(self) -> None:
        for name, problem in _problems(self):
            raise ConfigFieldError(name, problem)


def _problems(c: EngineConfig) -> list[tuple[str, str]]:
    """Every field ``c`` holds a value it cannot run with, and why."""
    checks: list[tuple[str, bool, str]] = [
        (
            "block_size",
            1 <= c.block_size <= MAX_BLOCK_SIZE and not c.block_size & (c.block_size - 1),
            f"must be a power of two in 1..{MAX_BLOCK_SIZE}, got {c.block_size}",
        ),
        ("max_num_batched_tokens", c.max_num_batched_tokens >= 1, "must be >= 1"),
        ("max_num_seqs", c.max_num_seqs >= 1, "must be >= 1"),
        ("max_waiting", c.max_waiting >= 0, "must be >= 0"),
        ("scheduling", c.scheduling in SCHEDULING, f"must be fair or fcfs, got {c.scheduling!r}"),
        ("fair_prefill_tokens", c.fair_prefill_tokens >= 1, "must be >= 1"),
        (
            "fair_decode_rows",
            c.fair_decode_rows is None or c.fair_decode_rows >= 0,
            f"must be >= 0, got {c.fair_decode_rows}",
        ),
        ("batch_max_wait_steps", c.batch_max_wait_steps >= 0, "must be >= 0"),
        ("kv_cache_bytes", c.kv_cache_bytes is None or c.kv_cache_bytes > 0, "must be > 0"),
        (
            "kv_cache_memory_fraction",
            0.0 < c.kv_cache_memory_fraction <= 1.0,
            "must be in (0, 1]",
        ),
        ("gpu_memory_utilization", 0.0 < c.gpu_memory_utilization <= 1.0, "must be in (0, 1]"),
        ("pin_cap_fraction", 0.0 <= c.pin_cap_fraction <= 1.0, "must be in [0, 1]"),
        ("host_kv_bytes", c.host_kv_bytes >= 0, "must be >= 0"),
        ("host_offload_priority", 0 <= c.host_offload_priority <= 100, "must be in 0..100"),
        (
            "kv_snapshot_key",
            c.kv_snapshot_key is None or len(c.kv_snapshot_key) >= SNAPSHOT_KEY_MIN,
            f"must be at least {SNAPSHOT_KEY_MIN} characters",  # never quotes the secret
        ),
        ("dtype", c.dtype in DTYPES, f"must be one of {', '.join(DTYPES)}, got {c.dtype!r}"),
        (
            "kv_dtype",
            c.kv_dtype in DTYPES,
            f"must be one of {', '.join(DTYPES)}, got {c.kv_dtype!r}",
        ),
        (
            "weights",
            c.weights in WEIGHTS,
            f"must be one of {', '.join(WEIGHTS)}, got {c.weights!r}",
        ),
    ]
    return [(name, problem) for name, ok, problem in checks if not ok]


@dataclass(frozen=True)
class ProcessVariable:
    """A variable an engine process reads from its environment itself (before torch loads, or
    where a kernel is built: no configuration object exists there); declared here, once, for
    the settings reference (gateway/settings.py lists it with the rest)."""

    name: str
    default: str
    meaning: str


CPU_ISA = ProcessVariable(
    "KVGATE_CPU_ISA",
    "auto",
    "highest x86 vector ISA of the CPU path: auto, or avx2 (kvgate's kernels, torch and oneDNN "
    "held to AVX2); environment only",
)
CPU_GEMM = ProcessVariable(
    "KVGATE_CPU_GEMM",
    "1",
    "kvgate's CPU GEMM: 1 (the best build the CPU runs), avx2 (its AVX2 build), 0 (torch's); "
    "environment only",
)
CACHE_DIR = ProcessVariable(
    "KVGATE_CACHE_DIR",
    "",
    "where compiled CPU kernels are kept; unset: ~/.cache/kvgate; environment only",
)
PROCESS_VARIABLES = (CPU_ISA, CPU_GEMM, CACHE_DIR)
