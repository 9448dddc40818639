"""KV snapshots are keyed: a file forged without the installation's key, written with another
key, or of a size the layout does not imply is refused (logged, removed, recomputed), never
loaded; the key file is private; one file per namespace holds the prompt pinned last; a
namespace's snapshot can be forgotten (its tenant deleted)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from pathlib import Path

import pytest

from engine import Engine
from engine.runtime.snapshot_key import KEY_FILE
from tests.engine._tiny_model import GREEDY, prompt
from tests.engine.test_tiers_snapshot import make_engine, pinned_then_restarted

KEY_A = "a" * 32
KEY_B = "b" * 32


def _answer(eng: Engine, ids: list[int], ns: str = "t") -> list[int]:
    return list(eng.generate([[*ids, 5]], GREEDY, namespace=ns)[0].token_ids)


def _recomputed(eng: Engine, ids: list[int]) -> bool:
    return eng.core.snapshots.restored == 0 and eng.num_model_tokens >= len(ids) - 1


def test_a_payload_forged_with_the_old_unkeyed_checksum_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    system = prompt(5, 64)
    eng = pinned_then_restarted(tmp_path, "t", system)
    path = eng.core.snapshots.store.path("t")
    data = bytearray(path.read_bytes())
    (n,) = struct.unpack_from("<Q", data, 8)
    assert len(data) - 40 > 16 + n  # a payload byte (header before it, the 32-byte tag after)
    data[-40] ^= 0x01
    # The format's unkeyed checksum: blake2b-256 of header | payload; and the same over the file.
    for covered in (data[16:-32], data[:-32]):
        data[-32:] = hashlib.blake2b(bytes(covered), digest_size=32).digest()
        path.write_bytes(bytes(data))
        forged = make_engine(tmp_path)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="engine.runtime.snapshot"):
            forged.pin_prefix("t", system)
        assert _recomputed(forged, system)
        assert "ignored: MAC mismatch" in caplog.text and "removed" in caplog.text
        forged.core.snapshots.flush()  # the recomputed prompt's own snapshot replaces it
    genuine = make_engine(tmp_path)
    genuine.pin_prefix("t", system)
    assert genuine.core.snapshots.restored == 1
    assert _answer(genuine, system) == _answer(make_engine(None, enable_prefix_reuse=False), system)


def test_another_installations_snapshot_is_refused_and_the_same_key_accepted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    system = prompt(6, 64)
    first = make_engine(tmp_path, kv_snapshot_key=KEY_A)
    first.pin_prefix("t", system)
    first.core.snapshots.flush()
    assert not (tmp_path / KEY_FILE).exists()  # a given key is not stored
    copy = tmp_path / "copy"
    copy.mkdir()
    name = first.core.snapshots.store.path("t").name
    (copy / name).write_bytes((tmp_path / name).read_bytes())

    same = make_engine(copy, kv_snapshot_key=KEY_A)  # another worker of the installation
    same.pin_prefix("t", system)
    assert same.core.snapshots.restored == 1 and same.num_model_tokens == 0

    other = make_engine(tmp_path, kv_snapshot_key=KEY_B)
    with caplog.at_level(logging.WARNING, logger="engine.runtime.snapshot"):
        other.pin_prefix("t", system)
    assert _recomputed(other, system) and "ignored: MAC mismatch" in caplog.text
    generated = make_engine(tmp_path / "generated")  # no key given: the key file's
    generated.pin_prefix("t", system)
    generated.core.snapshots.flush()
    (copy / name).write_bytes((tmp_path / "generated" / name).read_bytes())
    refused = make_engine(copy, kv_snapshot_key=KEY_A)
    refused.pin_prefix("t", system)
    assert _recomputed(refused, system)


def test_a_size_the_layout_does_not_imply_is_refused_before_the_payload_is_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    system = prompt(7, 64)
    eng = pinned_then_restarted(tmp_path, "t", system)
    store = eng.core.snapshots.store
    path = store.path("t")
    data = path.read_bytes()
    (n,) = struct.unpack_from("<Q", data, 8)
    header = json.loads(data[16 : 16 + n])
    # A well-formed, correctly keyed file whose header claims one block more than the prompt
    # has, payload to match: its size is not what this prompt's layout implies.
    header["num_blocks"] += 1
    header["payload_bytes"] += store.block_bytes
    head = json.dumps(header, sort_keys=True).encode()
    body = data[:8] + struct.pack("<Q", len(head)) + head + data[16 + n : -32]
    body += bytes(store.block_bytes)
    mac = store._mac()
    mac.update(body)
    path.write_bytes(body + mac.digest())
    with caplog.at_level(logging.WARNING, logger="engine.runtime.snapshot"):
        assert store.load("t", system) is None
    assert "the layout implies" in caplog.text and not path.exists()

    path.write_bytes(data)  # the genuine file, then a sparse gigabyte after it
    with path.open("r+b") as f:
        f.truncate(len(data) + (1 << 30))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="engine.runtime.snapshot"):
        assert store.load("t", system) is None
    assert f"size {len(data) + (1 << 30)} is not the {len(data)} bytes" in caplog.text


def test_the_key_file_is_private_and_an_unsafe_one_turns_snapshots_off(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    system = prompt(8, 64)
    pinned_then_restarted(tmp_path, "t", system)
    key = tmp_path / KEY_FILE
    assert key.stat().st_mode & 0o777 == 0o600 and key.stat().st_size == 32
    again = make_engine(tmp_path)
    again.pin_prefix("t", system)
    assert again.core.snapshots.restored == 1  # the same key, read back

    key.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="engine.runtime.snapshot_restore"):
        assert make_engine(tmp_path).core.snapshots is None
    assert "kv snapshots off" in caplog.text and "mode must be 0600" in caplog.text
    key.unlink()
    os.symlink(tmp_path / "elsewhere", key)
    assert make_engine(tmp_path).core.snapshots is None  # a link is never followed


def test_one_file_per_namespace_holds_the_version_pinned_last(tmp_path: Path) -> None:
    v1, v2 = prompt(9, 64), prompt(10, 64)
    eng = make_engine(tmp_path)
    for ids in (v1, v2, v1):  # a new version, then a rollback to the first
        eng.unpin(eng.pin_prefix("t", ids))
        eng.core.snapshots.flush()
    assert len(list(tmp_path.glob("*.kvsnap"))) == 1
    restarted = make_engine(tmp_path)
    restarted.pin_prefix("t", v1)
    assert restarted.core.snapshots.restored == 1 and restarted.num_model_tokens == 0


def test_forget_removes_the_file_even_behind_a_queued_write(tmp_path: Path) -> None:
    system = prompt(11, 64)
    eng = make_engine(tmp_path)
    eng.pin_prefix("t", system)  # its write may still be queued: the removal comes after it
    eng.core.forget_namespace("t").result()
    eng.core.snapshots.flush()
    assert not list(tmp_path.glob("*.kvsnap"))
    assert eng.core.forget_namespace("t").result() is False  # nothing left
    eng.pin_prefix("t", system)  # forgotten: pinned again, written again
    eng.core.snapshots.flush()
    assert len(list(tmp_path.glob("*.kvsnap"))) == 1


def test_the_key_setting_reaches_the_engine_and_is_never_shown() -> None:
    from engine.config import EngineConfig
    from gateway.settings import ModelSettings, SettingsError, load_source

    def model(env: dict[str, str]) -> ModelSettings:
        return ModelSettings.from_source(load_source(env))

    chosen = model({"KVGATE_KV_SNAPSHOT_KEY": KEY_A})
    assert chosen.engine_overrides()["kv_snapshot_key"] == KEY_A
    assert model({}).engine_overrides()["kv_snapshot_key"] is None
    config = EngineConfig(**chosen.engine_overrides())  # type: ignore[arg-type]
    assert KEY_A not in repr(chosen) and KEY_A not in repr(config)
    short = "s3cret-but-short"
    with pytest.raises(SettingsError, match="at least 32 characters") as err:
        model({"KVGATE_KV_SNAPSHOT_KEY": short})
    assert short not in str(err.value)
