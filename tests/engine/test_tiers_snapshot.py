"""Warm restarts: pinned prompts' KV saved to disk and restored at the next start instead of
recomputed; a snapshot that does not match exactly (model, namespace, prompt, block size) or is
truncated / corrupt is ignored with a log line and the prompt is recomputed."""

from __future__ import annotations

import functools
import logging
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from engine import Engine
from engine.runtime.model.demo import (
    TOKENIZER_VOCAB,
    qwen2_config,
    random_state_dict,
    write_model_dir,
)
from tests.engine._tiny_model import GREEDY, first_logits, kv_bytes, prompt, tiny_model_dir


def make_engine(
    snap: Path | None, block_size: int = 16, model: Path | None = None, **kw: object
) -> Engine:
    return Engine.from_pretrained(
        model or tiny_model_dir(),
        block_size=block_size,
        kv_cache_bytes=kv_bytes(-(-400 // block_size), block_size),
        kv_snapshot_dir=str(snap) if snap is not None else None,
        device="cpu",
        **{"dtype": "float32", **kw},
    )


def pinned_then_restarted(snap: Path, ns: str, ids: list[int], **kw: object) -> Engine:
    first = make_engine(snap, **kw)
    first.pin_prefix(ns, ids)
    first.core.snapshots.flush()
    return make_engine(snap, **kw)


@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_restart_restores_a_pinned_prompt_from_disk(tmp_path: Path, block_size: int) -> None:
    system = prompt(1)
    fresh = make_engine(None, block_size, enable_prefix_reuse=False)
    want_logits, want_tokens = first_logits(fresh, [*system, 7, 8], "t")

    eng = pinned_then_restarted(tmp_path, "t", system, block_size=block_size)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted([eng.core.snapshots.store.path("t").name, "snapshot.key"])
    handle = eng.pin_prefix("t", system)
    full = len(system) // block_size * block_size
    assert handle.num_tokens == full
    assert eng.num_model_tokens == 0 and eng.core.snapshots.restored == 1  # nothing computed
    assert eng.cache_stats().snapshot_restores == 1 and eng.cache_stats().snapshot_restore_us > 0
    got_logits, got_tokens = first_logits(eng, [*system, 7, 8], "t")
    assert got_tokens == want_tokens
    assert torch.allclose(got_logits, want_logits, atol=1e-5, rtol=0)
    eng.check_integrity()


@functools.cache
def other_model_dir() -> Path:
    cfg = qwen2_config(
        hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=TOKENIZER_VOCAB,
        max_pos=1024,
    )  # fmt: skip
    sd = random_state_dict(cfg, seed=99, dtype=torch.float32)
    tmp = tempfile.mkdtemp(prefix="kvgate-other-")
    return write_model_dir(Path(tmp), cfg, sd)


def _other_salt(tmp: Path, eng: Engine, system: list[int]) -> tuple[str, list[int]]:
    store = eng.core.snapshots.store
    store.path("t").rename(store.path("u"))  # tenant u's file name, tenant t's content
    return "u", system


def _other_version(tmp: Path, eng: Engine, system: list[int]) -> tuple[str, list[int]]:
    return "t", [*system[:-1], system[-1] + 1]


def _truncated(tmp: Path, eng: Engine, system: list[int]) -> tuple[str, list[int]]:
    path = eng.core.snapshots.store.path("t")
    path.write_bytes(path.read_bytes()[:-100])
    return "t", system


def _corrupt(tmp: Path, eng: Engine, system: list[int]) -> tuple[str, list[int]]:
    path = eng.core.snapshots.store.path("t")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return "t", system


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        (_other_salt, "namespace differs"),
        (_other_version, "prompt differs"),
        (_truncated, "size"),
        (_corrupt, "MAC mismatch"),
    ],
)
def test_mismatched_or_damaged_snapshots_are_recomputed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, case, reason: str
) -> None:
    system = prompt(2, 64)
    eng = pinned_then_restarted(tmp_path, "t", system)
    ns, ids = case(tmp_path, eng, system)
    with caplog.at_level(logging.WARNING, logger="engine.runtime.snapshot"):
        eng.pin_prefix(ns, ids)
    assert eng.core.snapshots.restored == 0 and eng.num_model_tokens >= len(ids) - 1
    assert f"ignored: {reason}" in caplog.text
    assert ",".join(map(str, ids[:3])) not in caplog.text  # no prompt in the log
    want = make_engine(None, enable_prefix_reuse=False).generate([[*ids, 5]], GREEDY)[0]
    assert eng.generate([[*ids, 5]], GREEDY, namespace=ns)[0].token_ids == want.token_ids


def test_other_model_or_block_size_recomputes(tmp_path: Path, caplog) -> None:
    system = prompt(3, 64)
    first = make_engine(tmp_path / "first")
    first.pin_prefix("t", system)
    first.core.snapshots.flush()
    cases = (
        ({"model": other_model_dir()}, "model differs"),
        ({"block_size": 32}, "block_size differs"),
        # bf16 linears beside the same float32 KV layout computed other K/V
        ({"dtype": "bfloat16"}, "model differs"),
    )
    for i, (kw, reason) in enumerate(cases):
        # Each case reads its own copy of the first engine's snapshot: an engine that recomputes
        # writes its own snapshot of the prompt, which must not become the next case's input.
        snap = tmp_path / f"case{i}"
        shutil.copytree(tmp_path / "first", snap)
        eng = make_engine(snap, **kw)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="engine.runtime.snapshot"):
            eng.pin_prefix("t", system)
        assert eng.core.snapshots.restored == 0 and eng.num_model_tokens > 0
        assert reason in caplog.text


def test_snapshot_written_atomically_once(tmp_path: Path) -> None:
    system = prompt(4, 64)
    eng = make_engine(tmp_path)
    h = eng.pin_prefix("t", system)
    eng.unpin(h)
    eng.pin_prefix("t", system)  # the same snapshot is on disk: not written again
    eng.core.snapshots.flush()
    assert eng.core.snapshots.saved == 1
    # no temporary file left behind: the snapshot and the installation's key
    assert len(list(tmp_path.glob("*.kvsnap"))) == 1 and len(list(tmp_path.iterdir())) == 2


def test_settings_carry_the_tier_options_to_the_engine(tmp_path: Path) -> None:
    from engine.config import EngineConfig
    from gateway.settings import ModelSettings, load_source

    def overrides(env: dict[str, str]) -> dict[str, object]:
        return ModelSettings.from_source(load_source(env)).engine_overrides()

    default = overrides({"KVGATE_VAR_DIR": str(tmp_path)})
    assert default["kv_snapshot_dir"] == str(tmp_path / "kv-snapshots")
    assert default["host_kv_bytes"] == 0
    assert overrides({"KVGATE_KV_SNAPSHOT_DIR": "off"})["kv_snapshot_dir"] is None
    chosen = overrides({"KVGATE_KV_SNAPSHOT_DIR": "/srv/snaps", "KVGATE_HOST_KV_BYTES": "1024"})
    assert chosen["kv_snapshot_dir"] == "/srv/snaps" and chosen["host_kv_bytes"] == 1024
    EngineConfig(**chosen)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="host_kv_bytes"):
        EngineConfig(host_kv_bytes=-1)
