"""The model's text side, torch-free: tokenizer, chat template, chat encoding (control tokens
from the template only), the text bound, and the model-file errors and readers they need.

What the gateway reads of a model to render and tokenize prompts and detokenize answers, on any
install (``pip install kvgate``, no torch): a Hugging Face directory's ``tokenizer.json`` /
``tokenizer_config.json``, or a GGUF file's tokenizer metadata (``load_tokenizer``). The engine's
runtime (engine/runtime/model/) builds its model on the same readers.
"""

from __future__ import annotations

from pathlib import Path

from engine.text.chat_encoding import ControlMarks, ForgedMark, TokenLimitExceeded
from engine.text.chat_template import TemplateError, template_variables
from engine.text.errors import ModelLoadError
from engine.text.gguf_reader import is_gguf, read_layout
from engine.text.gguf_tokenizer import gguf_tokenizer
from engine.text.text_bound import TextBound
from engine.text.tokenizer import IncrementalDetokenizer, Tokenizer

__all__ = [
    "ControlMarks",
    "ForgedMark",
    "IncrementalDetokenizer",
    "ModelLoadError",
    "TemplateError",
    "TextBound",
    "TokenLimitExceeded",
    "Tokenizer",
    "load_tokenizer",
    "template_variables",
]


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer and chat template of a checkpoint: a Hugging Face directory or a GGUF file
    (its metadata only; no tensor is read). ``ModelLoadError`` names the file and the problem."""
    path = Path(path)
    if is_gguf(path):
        return gguf_tokenizer(read_layout(path).metadata, str(path))
    if path.is_dir():
        return Tokenizer.from_pretrained(path)
    raise ModelLoadError(f"{path}: neither a model directory nor a GGUF file")
