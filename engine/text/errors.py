"""Errors of the model files the text side reads (no torch): tokenizer, chat template, GGUF
metadata, config.json; and the rules by which an HF directory's tokenizer files are found."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class ModelLoadError(Exception):
    """A model directory or file that cannot be loaded: missing file, unsupported config, bad
    tensor or metadata. The message names the file and the problem."""


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file of a model directory, or one ``ModelLoadError`` naming it."""
    if not path.is_file():
        raise ModelLoadError(f"{path}: file not found")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: cannot read JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: not a JSON object")
    return data


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
