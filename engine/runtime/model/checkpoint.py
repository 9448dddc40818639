"""A model path, and the loaders' checks that read no weight.

``model_path`` tells a GGUF file from a Hugging Face directory (the rule ``load_model``
follows). ``check_model`` runs the loaders' own checks that need only file presence, headers
and metadata, so a path that cannot load fails with the ``ModelLoadError`` loading would raise:

    .gguf file    header, metadata and tensor infos (every offset bounded by the file size),
                  the decoder config from the metadata, the tokenizer metadata's shapes
    HF directory  config.json, the weights' files (index, shards) and their safetensors
                  headers, tokenizer.json present, tokenizer_config.json readable

The HF tokenizer files' rules (``tokenizer_file``, ``tokenizer_config``) are the tokenizer's
(engine/text/errors.py): the check and the tokenizer load by the same ones. Torch-free and
cheap (no tensor is read, the GGUF reader imported for GGUF files only): ``kvgate serve`` runs
it before it migrates a database, prints an admin token or starts a worker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from engine.runtime.model.config import ModelConfig, dtype_name, parse_config
from engine.text.errors import ModelLoadError, read_json, tokenizer_config, tokenizer_file

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
        from engine.text.gguf_checks import check_tokenizer_metadata

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
