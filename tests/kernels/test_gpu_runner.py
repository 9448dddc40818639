"""The GPU runner's start-up logic as plain logic: device binding, default dtype, KV sizing from
an injected memory reading, and that the CPU path never imports Triton."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import engine.runtime.runner
from engine.config import EngineConfig
from engine.runtime import cpu_isa
from engine.runtime.device import (
    bind_device,
    choose_dtype,
    choose_kv_dtype,
    describe,
    resolve_device,
)
from engine.runtime.model.config import parse_config
from engine.runtime.model.decoder import Decoder
from engine.runtime.model.kv_memory import MemoryReading, block_bytes, profiled_kv_bytes
from engine.runtime.model.loader import load_model
from engine.text.errors import ModelLoadError
from tests.kernels.engine_fixtures import one_layer_model

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30


def test_bind_device_sets_the_threads_device_only_when_it_differs():
    calls: list[torch.device] = []
    cuda1 = torch.device("cuda", 1)
    assert bind_device(cuda1, current=lambda: 0, set_device=calls.append) is True
    assert calls == [cuda1]
    assert bind_device(cuda1, current=lambda: 1, set_device=calls.append) is False
    assert bind_device(torch.device("cpu"), current=lambda: 0, set_device=calls.append) is False
    assert calls == [cuda1]
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("cuda:3") == torch.device("cuda", 3)


def test_auto_dtype_is_bf16_on_cuda_and_on_cpus_with_bf16_units():
    cuda = torch.device("cuda", 0)
    assert choose_dtype("auto", cuda, bf16_supported=lambda: True) == "bfloat16"
    assert choose_dtype("auto", cuda, bf16_supported=lambda: False) == "float16"
    assert choose_dtype("float32", cuda, bf16_supported=lambda: True) == "float32"
    cpu = torch.device("cpu")
    # the CPU: bf16 where it has bf16 matrix units, float32 without, whatever the checkpoint says;
    # a GGUF stays auto (its blocks keep their kernels)
    assert choose_dtype("auto", cpu, bf16_supported=lambda: True) == "bfloat16"
    assert choose_dtype("auto", cpu, bf16_supported=lambda: False) == "float32"
    assert choose_dtype("auto", cpu, gguf=True, bf16_supported=lambda: True) == "auto"
    assert choose_dtype("bfloat16", cpu, bf16_supported=lambda: False) == "bfloat16"
    # the start-up line says which and why
    line = describe(cpu, torch.bfloat16, "bfloat16", torch.float32)
    assert line == "engine device cpu, dtype bfloat16 (configured), KV cache and attention float32"
    assert "GGUF" in describe(cpu, torch.float32, "auto", torch.float32, gguf=True)
    units = cpu_isa.native_bf16()
    want = f"bf16 units {units}" if units else "no bf16 units on this CPU"
    assert describe(cpu, torch.float32, "auto", torch.float32).endswith(f"(auto: {want})")


def test_auto_kv_dtype_is_float32_on_the_cpu_and_the_weights_dtype_on_cuda():
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert choose_kv_dtype("auto", torch.bfloat16, cpu) == torch.float32
    assert choose_kv_dtype("auto", torch.bfloat16, cuda) == torch.bfloat16
    assert choose_kv_dtype("bfloat16", torch.bfloat16, cpu) == torch.bfloat16
    assert choose_kv_dtype("float32", torch.float16, cpu) == torch.float32
    with pytest.raises(ValueError, match="kv_dtype float32 beside bfloat16 weights: use auto"):
        choose_kv_dtype("float32", torch.bfloat16, cuda)


def test_profiled_kv_bytes_fills_the_utilization_target():
    reading = MemoryReading(
        total=100 * GIB, free=60 * GIB, torch_reserved=30 * GIB, torch_peak=35 * GIB,
        profile_kv=1 * GIB,
    )  # fmt: skip
    assert reading.non_torch == 10 * GIB  # CUDA context and other processes
    assert reading.needed == 44 * GIB  # + weights and activations, less the profile's own KV
    assert profiled_kv_bytes(reading, 0.9) == 46 * GIB
    assert profiled_kv_bytes(reading, 0.4) == -4 * GIB


def test_runner_sizes_the_kv_cache_from_the_profile_step(monkeypatch: pytest.MonkeyPatch):
    path = one_layer_model()
    model = parse_config(path)
    config = EngineConfig(block_size=16, max_num_batched_tokens=96, max_num_seqs=4)
    loaded = load_model(path, "float32", "cpu")
    decoder = Decoder(model, loaded.weights, torch.float32, "cpu")
    seen: list[int] = []

    def reading(device: torch.device, profile_kv: int) -> MemoryReading:
        seen.append(profile_kv)
        return MemoryReading(10 * GIB, 6 * GIB, 3 * GIB, 2 * GIB, profile_kv)

    monkeypatch.setattr(engine.runtime.runner, "read_cuda_memory", reading)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    budget = engine.runtime.runner.profile_kv_bytes(config, model, decoder, torch.device("cpu"))
    # 96 tokens over 4 requests of 24: 2 blocks each
    assert seen == [8 * block_bytes(model, 16, torch.float32)]
    assert budget == int(10 * GIB * 0.9) - (1 * GIB + 2 * GIB - seen[0])


def test_a_budget_without_room_names_the_setting(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(engine.runtime.runner, "kv_budget_bytes", lambda config, device: 0)
    with pytest.raises(ModelLoadError, match="KVGATE_GPU_MEMORY_UTILIZATION"):
        engine.runtime.runner.ModelRunner.from_pretrained(
            one_layer_model(), EngineConfig(device="cpu")
        )


def test_engine_config_checks_the_utilization():
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        EngineConfig(gpu_memory_utilization=1.5)


def test_cpu_path_imports_no_triton(tmp_path: Path):
    script = f"""
        import sys
        import torch
        from engine import Engine
        from engine.runtime.model.demo import (TOKENIZER_VOCAB, qwen2_config, random_state_dict,
                                       write_model_dir)
        cfg = qwen2_config(hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64,
                           vocab=TOKENIZER_VOCAB, max_pos=64)
        path = write_model_dir(__import__("pathlib").Path({str(tmp_path)!r}), cfg,
                               random_state_dict(cfg, 1, torch.float32))
        eng = Engine.from_pretrained(path, device="cpu", kv_cache_bytes=1 << 20)
        from engine.params import SamplingParams
        out = eng.generate([[5, 6, 7]], SamplingParams(max_tokens=2, temperature=0.0))
        assert len(out[0].token_ids) == 2
        print("triton" in sys.modules, "engine.runtime.kernels.triton" in sys.modules)
    """
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], env=env, cwd=ROOT, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["False", "False"]


def test_settings_carry_the_gpu_options_to_the_engine():
    from gateway.settings import ModelSettings, SettingsError, load_source

    defaults = ModelSettings.from_source(load_source({})).engine_overrides()
    assert defaults["gpu_memory_utilization"] == 0.9 and defaults["cuda_graphs"] is True
    env = {"KVGATE_GPU_MEMORY_UTILIZATION": "0.75", "KVGATE_CUDA_GRAPHS": "0"}
    overrides = ModelSettings.from_source(load_source(env)).engine_overrides()
    assert overrides["gpu_memory_utilization"] == 0.75 and overrides["cuda_graphs"] is False
    EngineConfig(**overrides)
    with pytest.raises(SettingsError, match="KVGATE_GPU_MEMORY_UTILIZATION"):
        ModelSettings.from_source(load_source({"KVGATE_GPU_MEMORY_UTILIZATION": "0"}))
