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
from engine.runtime.model.config import ModelLoadError
from engine.runtime.model.loader import load_model
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


def missing(tmp_path: Path) -> Path:
    return tmp_path / "nope"


def garbage_gguf(tmp_path: Path) -> Path:
    path = tmp_path / "garbage.gguf"
    path.write_bytes(b"\x00garbage" * 100)
    return path


def truncated_gguf(tmp_path: Path) -> Path:
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    path.write_bytes(path.read_bytes()[:-64])  # the last tensor's data runs past the end
    return path


def gguf_without_tokenizer_model(tmp_path: Path) -> Path:
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    data = path.read_bytes().replace(b"tokenizer.ggml.model", b"tokenizer.ggml.mode_")
    path.write_bytes(data)
    return path


def no_config(tmp_path: Path) -> Path:
    path = _hf(tmp_path)
    (path / "config.json").unlink()
    return path


def bad_architecture(tmp_path: Path) -> Path:
    path = _hf(tmp_path)
    _edit_config(path, architectures=["GPT2LMHeadModel"], model_type="gpt2")
    return path


def no_weights(tmp_path: Path) -> Path:
    path = _hf(tmp_path)
    (path / "model.safetensors").unlink()
    return path


def garbage_weights(tmp_path: Path) -> Path:
    path = _hf(tmp_path)
    (path / "model.safetensors").write_bytes(b"\xff" * 64)
    return path


def no_tokenizer(tmp_path: Path) -> Path:
    path = _hf(tmp_path)
    (path / "tokenizer.json").unlink()
    return path


def bad_tokenizer_config(tmp_path: Path) -> Path:
    path = _hf(tmp_path)
    (path / "tokenizer_config.json").write_text("{not json")
    return path


def unsupported_dtype(tmp_path: Path) -> Path:
    path = _hf(tmp_path)
    _edit_config(path, torch_dtype="int8")
    return path


BROKEN = [
    missing,
    garbage_gguf,
    truncated_gguf,
    gguf_without_tokenizer_model,
    no_config,
    bad_architecture,
    no_weights,
    garbage_weights,
    no_tokenizer,
    bad_tokenizer_config,
    unsupported_dtype,
]


@pytest.mark.parametrize("make", BROKEN, ids=[f.__name__ for f in BROKEN])
def test_refuses_what_loading_refuses_with_the_same_message(
    tmp_path: Path, make: Callable[[Path], Path]
) -> None:
    path = make(tmp_path)
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
    sound, broken = write_tiny_gguf(tmp_path / "tiny.gguf"), garbage_gguf(tmp_path)
    code = (
        "import sys\n"
        "from engine.runtime.model.checkpoint import check_model\n"
        "from engine.runtime.model.config import ModelLoadError\n"
        f"check_model({str(sound)!r})\n"
        f"try:\n    check_model({str(broken)!r})\nexcept ModelLoadError:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton')))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert run.stdout.strip() == "[]", run.stdout
