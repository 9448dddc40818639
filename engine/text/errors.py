"""Errors of the model files the text side reads (no torch): tokenizer, chat template, GGUF
metadata, config.json."""

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
