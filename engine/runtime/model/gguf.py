"""GGUF checkpoints (llama.cpp's format), opened: read by ``gguf_reader.py``, tensors as views of
the memory-mapped file, the decoder config from the metadata. Torch-free: what ``kvgate serve``
checks before it starts anything (``checkpoint.py``); the weights are ``gguf_weights.py``'s.

A ``.gguf`` file carries the config (metadata under ``{arch}.*``), the tokenizer and chat template
(``tokenizer.*``) and the tensors, quantized or not.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from engine.runtime.model.config import ModelConfig, RopeConfig, check_config
from engine.text.errors import ModelLoadError
from engine.text.gguf_reader import ByteOrder, TensorInfo, is_gguf, read_layout

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}
PERMUTED_ARCHITECTURES = ("llama", "mistral")  # q/k rows interleaved for llama.cpp's RoPE


@dataclass(frozen=True)
class GGUFTensor:
    """A tensor of an opened GGUF: ``data`` is a read-only view of the memory-mapped file."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # GGML's order: the innermost dimension first
    data: np.ndarray


@dataclass(frozen=True)
class GGUFFile:
    """An opened GGUF: metadata values by key, tensors by name."""

    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensor]

    @classmethod
    def open(cls, path: str | Path) -> GGUFFile:
        """The file's metadata and tensors; ``ModelLoadError`` for anything malformed (every
        count, length and offset is bounded by the file size as it is read)."""
        path = Path(path)
        if not is_gguf(path):
            raise ModelLoadError(f"{path}: not a GGUF file")
        layout = read_layout(path)
        try:
            buf = np.memmap(path, mode="r") if layout.tensors else np.empty(0, np.uint8)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"{path}: cannot read GGUF file: {exc}") from exc
        tensors = {t.name: _tensor(t, buf, layout.byte_order) for t in layout.tensors}
        return cls(path, layout.metadata, tensors)

    @property
    def arch(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def arch_value(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.arch}.{key}", default)

    def require(self, key: str) -> Any:
        value = self.arch_value(key)
        if value is None:
            raise ModelLoadError(f"{self.path}: missing metadata {self.arch}.{key}")
        return value

    def integer(self, key: str, default: int | None = None) -> int:
        """``{arch}.{key}`` as a non-negative integer (required unless ``default`` is given)."""
        value = self.require(key) if default is None else self.arch_value(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ModelLoadError(
                f"{self.path}: metadata {self.arch}.{key} = {value!r:.60} is not an integer >= 0"
            )
        return value

    def real(self, key: str, default: float | None = None) -> float:
        """``{arch}.{key}`` as a float (required unless ``default`` is given)."""
        value = self.require(key) if default is None else self.arch_value(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ModelLoadError(
                f"{self.path}: metadata {self.arch}.{key} = {value!r:.60} is not a number"
            )
        return float(value)

    def shape(self, name: str) -> tuple[int, ...]:
        """Row-major (torch) shape: GGML lists dimensions innermost first."""
        return tuple(reversed(self.tensors[name].shape))


def _tensor(info: TensorInfo, buf: np.ndarray, byte_order: ByteOrder) -> GGUFTensor:
    return GGUFTensor(info.name, info.tensor_type, info.shape, info.data(buf, byte_order))


def _rope(f: GGUFFile, freq_factors: tuple[float, ...] | None) -> RopeConfig:
    theta = f.real("rope.freq_base", 10000.0)
    kind = f.arch_value("rope.scaling.type", "none")
    if kind == "linear":
        return RopeConfig(theta=theta, kind="linear", factor=f.real("rope.scaling.factor"))
    if kind not in ("none", None):
        raise ModelLoadError(f"{f.path}: rope scaling type {kind!r:.60} is not supported")
    return RopeConfig(theta=theta, freq_factors=freq_factors)


def _embedding_shape(f: GGUFFile) -> tuple[int, int]:
    if "token_embd.weight" not in f.tensors:
        raise ModelLoadError(f"{f.path}: tensor 'token_embd.weight' not found")
    shape = f.shape("token_embd.weight")
    if len(shape) != 2:
        raise ModelLoadError(f"{f.path}: tensor 'token_embd.weight' has shape {list(shape)}")
    return shape[0], shape[1]


def parse_gguf_config(f: GGUFFile) -> ModelConfig:
    """The decoder config from ``{arch}.*`` metadata and the tensor shapes (``check_config``)."""
    if f.arch not in ARCHITECTURES:
        raise ModelLoadError(
            f"{f.path}: unsupported GGUF architecture {f.arch!r:.60}; supported: "
            f"{', '.join(ARCHITECTURES)}"
        )
    vocab, hidden = _embedding_shape(f)
    heads = f.integer("attention.head_count")
    head_dim = f.integer("attention.key_length", 0) or hidden // max(heads, 1)
    rot = f.integer("rope.dimension_count", head_dim)
    if rot != head_dim:
        raise ModelLoadError(f"{f.path}: partial rotary ({rot} of {head_dim}) is not supported")
    context = f.integer("context_length", 4096)
    if f.integer("attention.sliding_window", context) < context:
        raise ModelLoadError(f"{f.path}: sliding-window attention is not supported")
    factors = None
    if "rope_freqs.weight" in f.tensors:  # Llama 3.1+ stores its rope scaling as factors
        factors = tuple(float(x) for x in dequantize_tensor(f, "rope_freqs.weight").tolist())
    cfg = ModelConfig(
        architecture=ARCHITECTURES[f.arch],
        hidden_size=hidden,
        num_layers=f.integer("block_count"),
        num_heads=heads,
        num_kv_heads=f.integer("attention.head_count_kv", 0) or heads,
        head_dim=head_dim,
        intermediate_size=f.integer("feed_forward_length"),
        vocab_size=vocab,
        rms_norm_eps=f.real("attention.layer_norm_rms_epsilon", 1e-6),
        rope=_rope(f, factors),
        max_position_embeddings=context,
        tie_word_embeddings="output.weight" not in f.tensors,
        qkv_bias="blk.0.attn_q.bias" in f.tensors,
        o_bias="blk.0.attn_output.bias" in f.tensors,
        torch_dtype=None,  # "auto" dequantizes to float32
    )
    return check_config(cfg, f.path)


def dequantize_tensor(f: GGUFFile, name: str) -> np.ndarray:
    """Tensor ``name`` of ``f`` dequantized (numpy, float32), in row-major shape."""
    from gguf.quants import dequantize

    tensor = f.tensors[name]
    try:
        out = dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as exc:
        raise ModelLoadError(
            f"{f.path}: tensor {name!r}: type {tensor.tensor_type.name} cannot be dequantized"
        ) from exc
    return out.reshape(f.shape(name))
