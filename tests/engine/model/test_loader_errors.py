"""Unloadable model directories fail with one ModelLoadError naming the file and tensor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.runtime.runner import ModelRunner
from engine.text.errors import ModelLoadError
from tests.engine.model.factories import make_hf_model, make_runner


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    make_hf_model(tmp_path, arch="qwen2", hidden=32, layers=1, intermediate=64)
    return tmp_path


def _edit_config(path: Path, **changes: object) -> None:
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def _edit_weights(path: Path, edit) -> None:
    weights = load_file(path / "model.safetensors")
    edit(weights)
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})


def test_missing_directory_and_config(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="model directory not found"):
        ModelRunner.from_pretrained(tmp_path / "nope")
    with pytest.raises(ModelLoadError, match=r"config\.json: file not found"):
        ModelRunner.from_pretrained(tmp_path)


def test_missing_weights_and_tokenizer(model_dir: Path) -> None:
    (model_dir / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors"):
        make_runner(model_dir)
    (model_dir / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match=r"tokenizer\.json: file not found"):
        make_runner(model_dir)


def test_missing_tensor_names_tensor_and_file(model_dir: Path) -> None:
    _edit_weights(model_dir, lambda w: w.pop("model.layers.0.mlp.up_proj.weight"))
    with pytest.raises(ModelLoadError, match=r"'model\.layers\.0\.mlp\.up_proj\.weight' not found"):
        make_runner(model_dir)


def test_shape_mismatch_names_tensor_and_shapes(model_dir: Path) -> None:
    def shrink(w: dict[str, torch.Tensor]) -> None:
        w["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(8, 32)

    _edit_weights(model_dir, shrink)
    with pytest.raises(ModelLoadError) as info:
        make_runner(model_dir)
    msg = str(info.value)
    assert "model.safetensors" in msg and "k_proj.weight" in msg and "[8, 32]" in msg
    assert "expected [16, 32]" in msg


def test_unsupported_architecture(model_dir: Path) -> None:
    _edit_config(model_dir, architectures=["GPT2LMHeadModel"], model_type="gpt2")
    with pytest.raises(ModelLoadError, match=r"unsupported architecture.*GPT2LMHeadModel"):
        make_runner(model_dir)


def test_sliding_window_refused(model_dir: Path) -> None:
    _edit_config(model_dir, architectures=["MistralForCausalLM"], sliding_window=64)
    with pytest.raises(ModelLoadError, match="sliding-window attention"):
        make_runner(model_dir)
    _edit_config(model_dir, architectures=["Qwen2ForCausalLM"], use_sliding_window=True)
    with pytest.raises(ModelLoadError, match="sliding-window attention"):
        make_runner(model_dir)


def test_mistral_without_window_loads(tmp_path: Path) -> None:
    make_hf_model(tmp_path, arch="llama", hidden=32, layers=1, intermediate=64)
    _edit_config(
        tmp_path, architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=None
    )
    assert make_runner(tmp_path).model_config.architecture == "MistralForCausalLM"


def test_unsupported_rope_and_missing_field(model_dir: Path) -> None:
    _edit_config(model_dir, rope_parameters={"rope_type": "yarn", "rope_theta": 1e4})
    with pytest.raises(ModelLoadError, match="rope scaling type 'yarn'"):
        make_runner(model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    del cfg["hidden_size"], cfg["rope_parameters"]
    (model_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="missing field 'hidden_size'"):
        make_runner(model_dir)


def test_missing_shard(tmp_path: Path) -> None:
    make_hf_model(tmp_path, hidden=32, layers=1, intermediate=64, max_shard_size="20KB")
    next(iter(sorted(tmp_path.glob("model-*.safetensors")))).unlink()
    with pytest.raises(ModelLoadError, match=r"shard listed in model\.safetensors\.index\.json"):
        make_runner(tmp_path)
