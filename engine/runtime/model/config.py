"""Parsing of an HF ``config.json`` into the decoder's frozen ``ModelConfig``.

Supported: LlamaForCausalLM (Llama 2/3, rope scaling ``llama3`` / ``linear``), Qwen2ForCausalLM
(q/k/v bias), MistralForCausalLM without a sliding window. Everything else is refused with one
``ModelLoadError`` that names the file and the field.

Torch-free, like everything a model is checked with before it is loaded (``checkpoint.py``):
``kvgate serve`` checks the model before it starts anything. What needs torch (rotary tables,
the torch dtype) is in ``rope.py`` and ``weights.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.core.step_cost import StepCost
from engine.text.errors import ModelLoadError, read_json

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
DTYPE_NAMES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    kind: str = "default"  # default | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    # Per-pair divisors of the frequencies, as GGUF files store Llama 3 scaling ("rope_freqs").
    freq_factors: tuple[float, ...] | None = None


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool  # Llama attention_bias=true also biases o_proj; Qwen2 does not
    torch_dtype: str | None  # as declared by the checkpoint; None when absent

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def step_cost(self) -> StepCost:
        """What a scheduled chunk costs this model (the fair share's unit; engine/core)."""
        return StepCost.from_geometry(
            hidden=self.hidden_size,
            layers=self.num_layers,
            heads=self.num_heads,
            kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            intermediate=self.intermediate_size,
            vocab=self.vocab_size,
        )


# The decoder precomputes rotary tables for every position (decoder.py), so the context length
# bounds memory at load time; 2M positions is above any supported model's context.
MAX_POSITIONS = 1 << 21


def check_config(cfg: ModelConfig, where: str | Path) -> ModelConfig:
    """``cfg`` if a decoder can be built from it, else a ``ModelLoadError`` naming the field."""
    sizes = {
        "hidden_size": cfg.hidden_size,
        "num_layers": cfg.num_layers,
        "num_heads": cfg.num_heads,
        "num_kv_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "vocab_size": cfg.vocab_size,
    }
    for name, value in sizes.items():
        if value < 1:
            raise ModelLoadError(f"{where}: {name} {value} is not positive")
    if cfg.head_dim % 2:
        raise ModelLoadError(f"{where}: head_dim {cfg.head_dim} is odd (rotary pairs)")
    if cfg.num_heads % cfg.num_kv_heads:
        raise ModelLoadError(
            f"{where}: {cfg.num_heads} attention heads do not divide into "
            f"{cfg.num_kv_heads} key/value heads"
        )
    if not 1 <= cfg.max_position_embeddings <= MAX_POSITIONS:
        raise ModelLoadError(
            f"{where}: context length {cfg.max_position_embeddings} is outside 1..{MAX_POSITIONS}"
        )
    for name, number in (("rms_norm_eps", cfg.rms_norm_eps), ("rope theta", cfg.rope.theta)):
        if not (math.isfinite(number) and number > 0):
            raise ModelLoadError(f"{where}: {name} {number} is not a positive number")
    return cfg


def _rope(raw: dict[str, Any], where: Path) -> RopeConfig:
    # transformers 5 writes "rope_parameters" (theta inside); older files "rope_theta" +
    # "rope_scaling" (with "type" or "rope_type").
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if kind not in ("default", "linear", "llama3"):
        raise ModelLoadError(f"{where}: rope scaling type {kind!r} is not supported")
    if kind == "default":
        return RopeConfig(theta=theta)
    return RopeConfig(
        theta=theta,
        kind=kind,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position=int(params.get("original_max_position_embeddings", 8192)),
    )


def _check_supported(raw: dict[str, Any], where: Path) -> str:
    archs = raw.get("architectures") or []
    arch: str | None = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        raise ModelLoadError(
            f"{where}: unsupported architecture {archs or raw.get('model_type')!r}; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    # Qwen2 configs carry a window that only counts with use_sliding_window; Mistral's always
    # counts. A window covering every position is plain causal attention.
    window = raw.get("sliding_window")
    uses_window = arch != "Qwen2ForCausalLM" or bool(raw.get("use_sliding_window", False))
    max_pos = int(raw.get("max_position_embeddings", 4096))
    if uses_window and window is not None and int(window) < max_pos:
        raise ModelLoadError(
            f"{where}: sliding-window attention (sliding_window={window}) is not supported"
        )
    if raw.get("hidden_act", "silu") != "silu":
        raise ModelLoadError(f"{where}: hidden_act {raw['hidden_act']!r} is not supported")
    if raw.get("mlp_bias"):
        raise ModelLoadError(f"{where}: mlp_bias=true is not supported")
    return arch


def parse_config(model_dir: Path) -> ModelConfig:
    where = model_dir / "config.json"
    raw = read_json(where)
    arch = _check_supported(raw, where)
    try:
        hidden = int(raw["hidden_size"])
        heads = int(raw["num_attention_heads"])
        cfg = ModelConfig(
            architecture=arch,
            hidden_size=hidden,
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            intermediate_size=int(raw["intermediate_size"]),
            vocab_size=int(raw["vocab_size"]),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope=_rope(raw, where),
            max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=arch == "Qwen2ForCausalLM" or bool(raw.get("attention_bias", False)),
            o_bias=arch != "Qwen2ForCausalLM" and bool(raw.get("attention_bias", False)),
            torch_dtype=raw.get("torch_dtype") or raw.get("dtype"),
        )
    except KeyError as exc:
        raise ModelLoadError(f"{where}: missing field {exc.args[0]!r}") from exc
    return check_config(cfg, where)


def dtype_name(requested: str, model: ModelConfig) -> str:
    """EngineConfig.dtype -> the name of the weights' dtype; "auto" follows the checkpoint
    (float32 if undeclared)."""
    if requested != "auto":
        return requested
    declared = model.torch_dtype or "float32"
    if declared not in DTYPE_NAMES:
        raise ModelLoadError(f"config.json: torch_dtype {declared!r} is not supported")
    return declared
