"""Tiny GGUF files written with the ``gguf`` package from a random HF model (as llama.cpp's
converter would: q/k rows permuted for Llama, 2-D weights quantized, norms and biases F32), with
the demo tokenizer and a chat template in the metadata."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.runtime.model.demo import SPECIAL_TOKENS
from tests.engine.model.factories import _tokenizer_files

# SmolLM2's template: a default system turn when the conversation has none.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(hf_name: str) -> str:
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf_name.split(".", 3)
    for hf, gg in _LAYER_NAMES.items():
        if rest.startswith(hf):
            return f"blk.{layer}.{gg}{rest[len(hf) :]}"
    raise KeyError(hf_name)


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf ``permute`` (rotary halves -> interleaved pairs)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def demo_vocab() -> tuple[list[str], list[int], list[str]]:
    """The demo tokenizer as GGUF metadata: tokens, token types, merges."""
    model = json.loads(_tokenizer_files()["tokenizer.json"])["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    types = [3 if t in SPECIAL_TOKENS else 1 for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, types, merges


def _add_metadata(w: Any, cfg: Any, pre: str) -> None:
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    if pre == "spm":
        _add_spm_tokenizer(w)
        return
    tokens, types, merges = demo_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|im_start|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_unk_token_id(tokens.index("<|endoftext|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)


# Mistral-style: BOS written by the template.
SPM_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}"
    "{{ message['content'] + eos_token }}{% endif %}{% endfor %}"
)
SPM_WORDS = "the order rocket has not arrived where is my hello world can you help me please"


def spm_vocab() -> tuple[list[str], list[int], list[float]]:
    """A SentencePiece-style vocabulary: <unk> <s> </s>, 256 byte tokens, letters, and every
    prefix of a few ``▁``-words (so each word is reachable by merges); scores favour longer."""
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    types = [2, 3, 3, *([6] * 256)]  # UNKNOWN, CONTROL, BYTE
    scores = [0.0, 0.0, 0.0, *([0.0] * 256)]
    pieces = list(dict.fromkeys("▁abcdefghijklmnopqrstuvwxyzMHW?.,'0123456789"))
    for word in SPM_WORDS.split():
        w = "▁" + word
        pieces += [w[:k] for k in range(2, len(w) + 1)] + [
            word[:k] for k in range(2, len(word) + 1)
        ]
    pieces = list(dict.fromkeys(pieces))
    tokens += pieces
    types += [1] * len(pieces)
    scores += [-1000.0 + len(p) * 10 - i * 0.01 for i, p in enumerate(pieces)]
    return tokens, types, scores


def _add_spm_tokenizer(w: Any) -> None:
    tokens, types, scores = spm_vocab()
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores(scores)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_chat_template(SPM_TEMPLATE)


def write_gguf(
    path: Path,
    model: Any,
    qtype: str = "F32",
    pre: str = "gpt2",
    raw_random: bool = False,
    extra: dict[str, np.ndarray] | None = None,
) -> Path:
    """``model`` (an HF Llama / Qwen2 in eval mode) as a GGUF file at ``path``.

    2-D weights are stored as ``qtype``; with ``raw_random`` they are random blocks of that type
    instead (for types the ``gguf`` package can dequantize but not quantize, like Q4_K / Q6_K)."""
    import gguf
    from gguf import GGMLQuantizationType as Q

    cfg = model.config
    arch = cfg.model_type
    w = gguf.GGUFWriter(str(path), arch)
    _add_metadata(w, cfg, pre)
    kind = Q[qtype]
    rng = np.random.default_rng(0)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        data = tensor.detach().to(torch.float32).numpy()
        if arch == "llama" and ".q_proj." in name:
            data = permute(data, cfg.num_attention_heads)
        elif arch == "llama" and ".k_proj." in name:
            data = permute(data, cfg.num_key_value_heads)
        if data.ndim == 1 or kind == Q.F32:
            w.add_tensor(gguf_name(name), np.ascontiguousarray(data))
        elif raw_random:
            w.add_tensor(gguf_name(name), random_blocks(kind, data.shape, rng), raw_dtype=kind)
        else:
            w.add_tensor(gguf_name(name), gguf.quants.quantize(data, kind), raw_dtype=kind)
    for name, array in (extra or {}).items():
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def random_blocks(kind: Any, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random quantized blocks whose float16 scales are small and finite."""
    from gguf import GGML_QUANT_SIZES
    from gguf import GGMLQuantizationType as Q

    block, size = GGML_QUANT_SIZES[kind]
    rows, cols = shape
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    # Byte offsets of the float16 scales, and a range that keeps weights within about +-0.3
    # (Q4_K: d * 6-bit scale * 4-bit q; Q6_K: d * int8 scale * 6-bit q).
    offsets, low, high = {Q.Q4_K: ((0, 2), 5e-5, 2e-4), Q.Q6_K: ((size - 2,), 1e-5, 5e-5)}[kind]
    for offset in offsets:
        values = rng.uniform(low, high, raw.shape[:2]).astype(np.float16)
        raw[:, :, offset : offset + 2] = values.view(np.uint8).reshape(*raw.shape[:2], 2)
    return raw.reshape(rows, -1)


def write_tiny_gguf(path: Path, seed: int = 0) -> Path:
    """The smallest loadable GGUF worth having (about 20 KB): a one-layer Llama of width 8 (two
    heads of 4, one key/value head) with a byte-level vocabulary of the 256 byte symbols, two
    merges and three control tokens; float32 weights drawn from ``seed``."""
    import gguf

    from engine.text.gguf_tokenizer import byte_alphabet

    tokens = [*byte_alphabet().values(), "Ġt", "Ġth", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    types = [1] * (len(tokens) - 3) + [3, 3, 3]
    w = gguf.GGUFWriter(str(path), "llama")
    for add, value in (
        (w.add_block_count, 1), (w.add_context_length, 64), (w.add_embedding_length, 8),
        (w.add_feed_forward_length, 16), (w.add_head_count, 2), (w.add_head_count_kv, 1),
        (w.add_rope_dimension_count, 4), (w.add_layer_norm_rms_eps, 1e-5),
    ):  # fmt: skip
        add(value)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(["Ġ t", "Ġt h"])
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_chat_template(CHAT_TEMPLATE)
    rng = np.random.default_rng(seed)
    shapes = {
        "token_embd.weight": (len(tokens), 8), "output_norm.weight": (8,),
        "blk.0.attn_norm.weight": (8,), "blk.0.ffn_norm.weight": (8,),
        "blk.0.attn_q.weight": (8, 8), "blk.0.attn_k.weight": (4, 8),
        "blk.0.attn_v.weight": (4, 8), "blk.0.attn_output.weight": (8, 8),
        "blk.0.ffn_gate.weight": (16, 8), "blk.0.ffn_up.weight": (16, 8),
        "blk.0.ffn_down.weight": (8, 16),
    }  # fmt: skip
    for name, shape in shapes.items():
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
