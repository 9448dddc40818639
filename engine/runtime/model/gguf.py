"""GGUF checkpoints (llama.cpp's format): read by ``gguf_reader.py``, dequantized with the ``gguf``
package.

A ``.gguf`` file carries the config (metadata under ``{arch}.*``), the tokenizer and chat template
(``tokenizer.*``) and the tensors, quantized or not. Every tensor is dequantized once at load time
(``gguf.quants.dequantize``: F32, F16, BF16, Q4_0/Q4_1/Q5_x/Q8_0, the K-quants, ...) to the engine
dtype and mapped to the decoder's fused layout. llama.cpp stores Llama / Mistral q and k rows
permuted for its rotary kernel; that permutation is undone here (Qwen2 files are not permuted).

    GGUF name                         decoder field
    token_embd.weight                 embed              output_norm.weight   norm
    output.weight (absent: tied)      lm_head
    blk.N.attn_norm / ffn_norm        input_norm / post_norm
    blk.N.attn_{q,k,v}.{weight,bias}  qkv, qkv_bias      blk.N.attn_output    o_proj
    blk.N.ffn_{gate,up,down}          gate_up, down
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType

from engine.runtime.model.blocks import BLOCK_BYTES, BlockWeight, cat_rows
from engine.runtime.model.config import ModelConfig, RopeConfig, check_config, resolve_dtype
from engine.runtime.model.weights import LayerWeights, LoadedModel, ModelWeights
from engine.text.errors import ModelLoadError
from engine.text.gguf_reader import ByteOrder, TensorInfo, is_gguf, read_layout
from engine.text.gguf_tokenizer import gguf_tokenizer

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
        factors = tuple(float(x) for x in _dequantize(f, "rope_freqs.weight").tolist())
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


def _dequantize(f: GGUFFile, name: str) -> np.ndarray:
    from gguf.quants import dequantize

    tensor = f.tensors[name]
    try:
        out = dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as exc:
        raise ModelLoadError(
            f"{f.path}: tensor {name!r}: type {tensor.tensor_type.name} cannot be dequantized"
        ) from exc
    return out.reshape(f.shape(name))


def _unpermute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Inverse of llama.cpp's convert ``permute``: per head, rows (pair, half) -> (half, pair)."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


class _Tensors:
    """Reads one GGUF tensor at a time: shape check, dequantize (or keep its blocks), cast."""

    def __init__(
        self, f: GGUFFile, cfg: ModelConfig, dtype: torch.dtype, device: str, blocks: bool
    ) -> None:
        self.f, self.dtype, self.device, self.blocks = f, dtype, device, blocks
        self.permute = f.arch in PERMUTED_ARCHITECTURES
        self.heads = {"attn_q": cfg.num_heads, "attn_k": cfg.num_kv_heads}

    def _check(self, name: str, shape: tuple[int, ...]) -> None:
        if name not in self.f.tensors:
            raise ModelLoadError(f"{self.f.path}: tensor {name!r} not found")
        actual = self.f.shape(name)
        if actual != shape:
            raise ModelLoadError(
                f"{self.f.path}: tensor {name!r} has shape {list(actual)}, expected {list(shape)}"
            )

    def weight(self, name: str, shape: tuple[int, int]) -> torch.Tensor | BlockWeight:
        """A matrix: kept in its block format when that is Q4_1 or Q8_0 and blocks are wanted."""
        self._check(name, shape)
        kind = self.f.tensors[name].tensor_type.name.lower()
        if not self.blocks or kind not in BLOCK_BYTES:
            return self.get(name, shape)
        w = BlockWeight.from_gguf(kind, self.f.tensors[name].data, shape)
        role = name.split(".")[-2]
        if self.permute and role in self.heads:
            heads = self.heads[role]
            w = w.map_rows(lambda t: _unpermute(t, heads))
        return w

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        self._check(name, shape)
        array = _dequantize(self.f, name)
        if not array.flags.writeable:  # a view of the memory-mapped file
            array = array.copy()
        t = torch.from_numpy(array).to(self.dtype)
        kind = name.split(".")[-2]
        if self.permute and kind in self.heads:
            t = _unpermute(t, self.heads[kind])
        return t.to(self.device)


def _layer(r: _Tensors, cfg: ModelConfig, i: int) -> LayerWeights:
    p = f"blk.{i}."
    h, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    sizes = (("q", q), ("k", kv), ("v", kv))
    qkv = cat_rows([r.weight(f"{p}attn_{n}.weight", (s, h)) for n, s in sizes])
    qkv_bias = None
    if cfg.qkv_bias:
        qkv_bias = torch.cat([r.get(f"{p}attn_{n}.bias", (s,)) for n, s in sizes])
    return LayerWeights(
        input_norm=r.get(p + "attn_norm.weight", (h,)),
        qkv=qkv,
        qkv_bias=qkv_bias,
        o_proj=r.weight(p + "attn_output.weight", (h, q)),
        o_bias=r.get(p + "attn_output.bias", (h,)) if cfg.o_bias else None,
        post_norm=r.get(p + "ffn_norm.weight", (h,)),
        gate_up=cat_rows(
            [r.weight(p + "ffn_gate.weight", (inter, h)), r.weight(p + "ffn_up.weight", (inter, h))]
        ),
        down=r.weight(p + "ffn_down.weight", (h, inter)),
    )


def load_gguf_weights(
    f: GGUFFile, cfg: ModelConfig, dtype: torch.dtype, device: str, blocks: bool = False
) -> ModelWeights:
    """Every tensor the decoder needs, dequantized to ``dtype`` on ``device``; with ``blocks``,
    Q4_1 and Q8_0 matrices stay in their blocks (``blocks.py``)."""
    r = _Tensors(f, cfg, dtype, device, blocks)
    v, h = cfg.vocab_size, cfg.hidden_size
    embed = r.weight("token_embd.weight", (v, h))
    layers = tuple(_layer(r, cfg, i) for i in range(cfg.num_layers))
    lm_head = embed if cfg.tie_word_embeddings else r.weight("output.weight", (v, h))
    return ModelWeights(
        embed=embed, layers=layers, norm=r.get("output_norm.weight", (h,)), lm_head=lm_head
    )


def load_gguf(path: str | Path, dtype: str, device: str, blocks: bool = False) -> LoadedModel:
    """Config, tokenizer and weights of a GGUF file: dequantized, or with ``blocks`` (CPU,
    float32 only) its Q4_1 and Q8_0 matrices kept as they are stored."""
    f = GGUFFile.open(path)
    cfg = parse_gguf_config(f)
    torch_dtype = resolve_dtype(dtype, cfg)
    keep = blocks and torch_dtype == torch.float32 and torch.device(device).type == "cpu"
    tokenizer = gguf_tokenizer(f.metadata, str(f.path))
    weights = load_gguf_weights(f, cfg, torch_dtype, device, keep)
    return LoadedModel(cfg, tokenizer, weights, torch_dtype)
