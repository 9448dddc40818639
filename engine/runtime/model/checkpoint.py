"""A model path, and the loaders' checks that read no weight.

``model_path`` tells a GGUF file from a Hugging Face directory (the rule ``load_model``
follows). ``check_model`` runs the loaders' own checks that need only file presence, headers
and metadata, so a path that cannot load fails with the ``ModelLoadError`` loading would raise:

    .gguf file    header, metadata and tensor infos (every offset bounded by the file size),
                  the decoder config from the metadata, the tokenizer metadata's shapes
    HF directory  config.json, the weights' files (index, shards) and their safetensors
                  headers, tokenizer.json present, tokenizer_config.json readable

The HF tokenizer files' rules (``tokenizer_file``, ``tokenizer_config``) are here too: the
tokenizer (tokenizer.py) loads by them. Torch-free and cheap (no tensor is read, the GGUF reader
imported for GGUF files only): ``kvgate serve`` runs it before it migrates a database, prints an
admin token or starts a worker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from engine.runtime.model.config import (
    ModelConfig,
    ModelLoadError,
    dtype_name,
    parse_config,
    read_json,
)

ModelKind = Literal["gguf", "hf"]


def model_path(path: str | Path) -> tuple[Path, ModelKind]:
    """``path`` and its kind: a file is a GGUF checkpoint, a directory a Hugging Face one."""
    path = Path(path)
    if path.is_file():
        return path, "gguf"
    if not path.is_dir():
        raise ModelLoadError(f"{path}: model directory not found (nor a .gguf file)")
    return path, "hf"


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The safetensors files of an HF directory: the index's shards, else every file."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map") or {}
        names = sorted(set(weight_map.values()))
        files = [model_dir / n for n in names]
        for f in files:
            if not f.is_file():
                raise ModelLoadError(f"{f}: shard listed in {index.name} not found")
        if not files:
            raise ModelLoadError(f"{index}: empty weight_map")
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{model_dir}: no *.safetensors weights found")
    return files


def tokenizer_file(model_dir: Path) -> Path:
    """An HF directory's ``tokenizer.json`` (``ModelLoadError`` when it is missing)."""
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise ModelLoadError(f"{path}: file not found")
    return path


def tokenizer_config(model_dir: Path) -> dict[str, Any]:
    """An HF directory's ``tokenizer_config.json`` (optional), with the chat template from
    ``chat_template.jinja`` when the config has none."""
    path = model_dir / "tokenizer_config.json"
    tok_cfg = read_json(path) if path.is_file() else {}
    template_file = model_dir / "chat_template.jinja"
    if "chat_template" not in tok_cfg and template_file.is_file():
        tok_cfg["chat_template"] = template_file.read_text(encoding="utf-8")
    return tok_cfg


def unreadable_safetensors(path: Path, exc: Exception) -> ModelLoadError:
    return ModelLoadError(f"{path}: cannot open safetensors file: {exc}")


def check_safetensors(files: list[Path]) -> None:
    """Each file's safetensors header parses (its tensors are not read)."""
    from safetensors import safe_open

    for path in files:
        try:
            with safe_open(str(path), framework="numpy"):
                pass
        except Exception as exc:  # safetensors raises its own error types
            raise unreadable_safetensors(path, exc) from exc


def check_model(path: str | Path, dtype: str = "auto") -> ModelConfig:
    """The config of the model at ``path`` if the loaders' weight-free checks pass, else their
    ``ModelLoadError``; ``dtype`` as EngineConfig.dtype."""
    path, kind = model_path(path)
    if kind == "gguf":  # the GGUF reader (numpy, gguf) only for a GGUF path
        from engine.runtime.model.gguf import GGUFFile, parse_gguf_config
        from engine.runtime.model.gguf_checks import check_tokenizer_metadata

        f = GGUFFile.open(path)
        cfg = parse_gguf_config(f)
        check_tokenizer_metadata(f.metadata, str(path))
    else:
        cfg = parse_config(path)
        check_safetensors(checkpoint_files(path))
        tokenizer_file(path)
        tokenizer_config(path)
    dtype_name(dtype, cfg)
    return cfg
