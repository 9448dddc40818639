"""``check_model``: the loaders' own refusals, found without reading a weight or importing torch.

Every broken checkpoint below is refused by ``check_model`` with exactly the message loading it
gives (one set of rules, not two); sound checkpoints pass with the config loading finds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.runtime.model.checkpoint import check_model
from engine.runtime.model.loader import load_model
from engine.text.errors import ModelLoadError
from tests.engine.model.factories import make_hf_model
from tests.engine.model.gguf_factory import write_tiny_gguf

ROOT = Path(__file__).resolve().parents[3]


def _hf(tmp_path: Path) -> Path:
    make_hf_model(tmp_path / "hf", arch="qwen2", hidden=32, layers=1, intermediate=64)
    return tmp_path / "hf"


def _edit_config(path: Path, **changes: object) -> None:
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def _write(name: str, data: bytes) -> Callable[[Path], None]:
    return lambda path: (path / name).write_bytes(data)


def _remove(name: str) -> Callable[[Path], None]:
    return lambda path: (path / name).unlink()


def _gguf_edit(path: Path, edit: Callable[[bytes], bytes]) -> None:
    path.write_bytes(edit(path.read_bytes()))


# What breaks a checkpoint: (kind, edit) applied to a sound HF directory or GGUF file, or to
# nothing at all (the path does not exist; a file of garbage).
BROKEN: dict[str, tuple[str, Callable[[Path], None]]] = {
    "missing": ("none", lambda path: None),
    "garbage_gguf": ("none", lambda path: path.write_bytes(b"\x00garbage" * 100)),
    # the last tensor's data runs past the end of the file
    "truncated_gguf": ("gguf", lambda path: _gguf_edit(path, lambda data: data[:-64])),
    "gguf_without_tokenizer_model": (
        "gguf",
        lambda path: _gguf_edit(
            path, lambda data: data.replace(b"tokenizer.ggml.model", b"tokenizer.ggml.mode_")
        ),
    ),
    "no_config": ("hf", _remove("config.json")),
    "bad_architecture": (
        "hf",
        lambda path: _edit_config(path, architectures=["GPT2LMHeadModel"], model_type="gpt2"),
    ),
    "no_weights": ("hf", _remove("model.safetensors")),
    "garbage_weights": ("hf", _write("model.safetensors", b"\xff" * 64)),
    "no_tokenizer": ("hf", _remove("tokenizer.json")),
    "bad_tokenizer_config": ("hf", _write("tokenizer_config.json", b"{not json")),
    "unsupported_dtype": ("hf", lambda path: _edit_config(path, torch_dtype="int8")),
}


def broken(tmp_path: Path, case: str) -> Path:
    kind, edit = BROKEN[case]
    path = {
        "none": lambda: tmp_path / "model.gguf",
        "gguf": lambda: write_tiny_gguf(tmp_path / "tiny.gguf"),
        "hf": lambda: _hf(tmp_path),
    }[kind]()
    edit(path)
    return path


@pytest.mark.parametrize("case", list(BROKEN))
def test_refuses_what_loading_refuses_with_the_same_message(tmp_path: Path, case: str) -> None:
    path = broken(tmp_path, case)
    with pytest.raises(ModelLoadError) as loading:
        load_model(path, "auto", "cpu")
    with pytest.raises(ModelLoadError) as checking:
        check_model(path)
    assert str(checking.value) == str(loading.value)


def test_sound_checkpoints_pass_with_the_config_loading_finds(tmp_path: Path) -> None:
    for path in (_hf(tmp_path), write_tiny_gguf(tmp_path / "tiny.gguf")):
        assert check_model(path) == load_model(path, "auto", "cpu").config


def test_the_check_imports_no_torch(tmp_path: Path) -> None:
    """What ``kvgate serve`` runs before anything starts: torch's import alone takes seconds."""
    sound, garbage = write_tiny_gguf(tmp_path / "tiny.gguf"), broken(tmp_path, "garbage_gguf")
    code = (
        "import sys\n"
        "from engine.runtime.model.checkpoint import check_model\n"
        "from engine.text.errors import ModelLoadError\n"
        f"check_model({str(sound)!r})\n"
        f"try:\n    check_model({str(garbage)!r})\nexcept ModelLoadError:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton')))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert run.stdout.strip() == "[]", run.stdout
