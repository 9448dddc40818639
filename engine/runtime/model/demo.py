"""The deterministic demo model: ``kvgate demo-model PATH``.

A small Qwen2-architecture model in Hugging Face format (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json, generation_config.json) with random weights from a fixed
seed and a byte-level BPE tokenizer trained locally on a built-in text. Every run writes the same
bytes, so the directory can be compared by hash and loads in HF transformers as well.

The helpers here (tokenizer files, random weights, writing a model directory) are also used by
``bench/models.py`` to build random models of real geometries.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from tokenizers import Tokenizer

DEMO_SEED = 20240601
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TOKENIZER_VOCAB = 2000

# ChatML; the system turn is optional.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_WORD_TEXT = (
    "the of and to in is that for it as with was on be by at this are from or have an they which "
    "one you were her all she there would their we him been has when who will more no if out so "
    "said what up its about into than them can only other new some could time these two may then "
    "do first any my now such like our over man me even most made after also did many before must "
    "through back years where much your way well down should because each just those people how "
    "too little state good very make world still own see men work long get here between both life "
    "being under never day same another know while last might us great old year off come since "
    "against go came right used take three hello please thanks question answer summary explain "
    "kvgate paged attention cache prefix tenant gateway model token block request stream chat "
    "assistant user system"
)
_HEADER = (
    "Hello! How can I help you today? Please summarize the following text. "
    "The quick brown fox jumps over the lazy dog. 0123456789 (a, b) [c; d] {e: f} \"g\" 'h' #1 "
)


def demo_corpus() -> list[str]:
    """The fixed training text: English words, syllable pseudo-words and numbers (seeded)."""
    rng = random.Random(7)
    syllables = [c + v for c in "bcdfghklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]
    pseudo = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(1500)]
    words = _WORD_TEXT.split() + pseudo + [str(rng.randint(0, 99999)) for _ in range(200)]
    lines = [_HEADER] * 3
    for _ in range(6000):
        n = rng.randint(4, 14)
        sentence = " ".join(rng.choice(words) for _ in range(n)).capitalize()
        lines.append(sentence + rng.choice(".?!,;"))
    return lines


def train_demo_tokenizer() -> Tokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=1,
        show_progress=False,
    )
    tok.train_from_iterator(demo_corpus(), trainer)
    return tok


def write_tokenizer_files(path: Path) -> int:
    """Write tokenizer.json + tokenizer_config.json (ChatML); returns the tokenizer vocab size."""
    tok = train_demo_tokenizer()
    (path / "tokenizer.json").write_text(tok.to_str(pretty=True), encoding="utf-8")
    added = {
        str(tok.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "chat_template": CHATML_TEMPLATE,
    }
    _write_json(path / "tokenizer_config.json", config)
    return tok.get_vocab_size()


def special_token_ids() -> dict[str, int]:
    # The trainer puts the special tokens first, in order.
    return {t: i for i, t in enumerate(SPECIAL_TOKENS)}


def qwen2_config(
    *,
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    vocab: int,
    max_pos: int,
    rope_theta: float = 1_000_000.0,
    tied: bool = True,
    dtype: str = "float32",
    arch: str = "qwen2",
) -> dict[str, Any]:
    """An HF config.json dict for Qwen2ForCausalLM (arch="qwen2") or LlamaForCausalLM ("llama")."""
    ids = special_token_ids()
    cfg: dict[str, Any] = {
        "architectures": ["Qwen2ForCausalLM" if arch == "qwen2" else "LlamaForCausalLM"],
        "model_type": arch,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "hidden_act": "silu",
        "max_position_embeddings": max_pos,
        "rms_norm_eps": 1e-6,
        "rope_theta": rope_theta,
        "tie_word_embeddings": tied,
        "torch_dtype": dtype,
        "vocab_size": vocab,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "attention_dropout": 0.0,
        "use_cache": True,
    }
    if arch == "qwen2":
        cfg.update(use_sliding_window=False, sliding_window=None, max_window_layers=layers)
    else:
        cfg.update({"attention_bias": False, "mlp_bias": False, "pretraining_tp": 1})
    return cfg


def random_state_dict(
    cfg: dict[str, Any], seed: int, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """Seeded random weights in HF tensor names (std 0.02 matrices, norms near 1)."""
    gen = torch.Generator().manual_seed(seed)
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q_dim, kv_dim = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    bias = cfg["model_type"] == "qwen2"

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.02).to(dtype)

    def norm() -> torch.Tensor:
        return (1.0 + torch.randn(h, generator=gen) * 0.05).to(dtype)

    sd = {"model.embed_tokens.weight": normal(v, h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = norm()
        for name, out in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)):
            sd[p + f"self_attn.{name}_proj.weight"] = normal(out, h)
            if bias:
                sd[p + f"self_attn.{name}_proj.bias"] = normal(out)
        sd[p + "self_attn.o_proj.weight"] = normal(h, q_dim)
        sd[p + "post_attention_layernorm.weight"] = norm()
        sd[p + "mlp.gate_proj.weight"] = normal(inter, h)
        sd[p + "mlp.up_proj.weight"] = normal(inter, h)
        sd[p + "mlp.down_proj.weight"] = normal(h, inter)
    sd["model.norm.weight"] = norm()
    if not cfg["tie_word_embeddings"]:
        sd["lm_head.weight"] = normal(v, h)
    return sd


def write_model_dir(path: Path, cfg: dict[str, Any], state_dict: dict[str, torch.Tensor]) -> Path:
    """config.json + model.safetensors + generation_config.json + the demo tokenizer files."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    _write_json(path / "config.json", cfg)
    save_file(state_dict, str(path / "model.safetensors"), metadata={"format": "pt"})
    ids = special_token_ids()
    gen_cfg = {
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "pad_token_id": ids["<|endoftext|>"],
        "do_sample": False,
    }
    _write_json(path / "generation_config.json", gen_cfg)
    write_tokenizer_files(path)
    return path


def write_demo_model(path: str | Path) -> Path:
    """Write the demo model (hidden 256, 4 layers, 4 heads, 2 KV heads, float32) to ``path``."""
    path = Path(path)
    cfg = qwen2_config(
        hidden=256,
        layers=4,
        heads=4,
        kv_heads=2,
        intermediate=688,
        vocab=TOKENIZER_VOCAB,
        max_pos=4096,
    )
    return write_model_dir(path, cfg, random_state_dict(cfg, DEMO_SEED, torch.float32))


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvgate demo-model", description=__doc__.splitlines()[0])
    parser.add_argument("path", help="directory to write the model into (created if missing)")
    args = parser.parse_args(list(argv[1:]))
    out = write_demo_model(args.path)
    print(f"demo model written to {out}")
    return 0
