"""The secrets key and what it seals (tenants/sealing.py, tenants/secret_keys.py): round trips,
a wrong key is an error and never garbage, a ring of keys for rotation, the key list's rules,
and the generated key file (0600, owner and mode checked, one winner when created at once)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from tenants.sealing import SecretBox, SecretsKeyError, SecretUnreadable, is_sealed, parse_keys
from tenants.secret_keys import SecretsSettings, key_file_secret, load_box

OLD = "old-key-" + "a" * 32
NEW = "new-key-" + "b" * 32


def test_seal_and_unseal() -> None:
    box = SecretBox([OLD])
    stored = box.seal("bearer-token-123")
    assert is_sealed(stored) and "bearer-token-123" not in stored
    assert box.seal("bearer-token-123") != stored  # a fresh IV each time
    assert box.unseal(stored) == "bearer-token-123"
    assert box.current == box.fingerprints[0] and len(box.current) == 12
    assert OLD not in repr(box) and box.current in repr(box)


def test_a_wrong_key_is_an_error_never_garbage() -> None:
    stored = SecretBox([OLD]).seal("s3cret")
    with pytest.raises(SecretUnreadable, match="opens with no key of KVGATE_SECRETS_KEY"):
        SecretBox([NEW]).unseal(stored)
    tampered = stored[:-6] + ("A" if stored[-6] != "A" else "B") + stored[-5:]
    with pytest.raises(SecretUnreadable):
        SecretBox([OLD]).unseal(tampered)
    with pytest.raises(SecretUnreadable, match="not sealed"):
        SecretBox([OLD]).unseal("s3cret")  # a clear value is never passed on as a secret


def test_a_ring_opens_with_any_key_and_reseals_under_the_first() -> None:
    stored = SecretBox([OLD]).seal("s3cret")
    ring = SecretBox([NEW, OLD])
    assert ring.unseal(stored) == "s3cret"
    assert ring.opens(SecretBox([OLD]).current, stored)
    assert not ring.opens(ring.current, stored)
    moved = ring.reseal(stored)
    assert SecretBox([NEW]).unseal(moved) == "s3cret"
    with pytest.raises(SecretUnreadable):
        SecretBox([OLD]).unseal(moved)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("short", "key 1 of 1 has fewer than 32"),
        (f"{NEW},short", "key 2 of 2 has fewer than 32"),
        (f"{NEW},", "key 2 of 2"),
        (f"{NEW},{NEW}", "a key is listed twice"),
    ],
)
def test_the_key_list_is_checked(raw: str, message: str) -> None:
    with pytest.raises(SecretsKeyError, match=f"KVGATE_SECRETS_KEY: {message}"):
        parse_keys(raw)


def test_keys_and_where_they_come_from() -> None:
    assert parse_keys(f" {NEW} , {OLD}") == (NEW, OLD)
    pg = "postgresql+asyncpg://u@h/db"
    assert SecretsSettings.from_env({"KVGATE_SECRETS_KEY": NEW}, pg).keys == (NEW,)
    with pytest.raises(SecretsKeyError, match="required with a database other than"):
        load_box(SecretsSettings.from_env({}, pg))
    embedded = SecretsSettings.from_env({"KVGATE_VAR_DIR": "/x"}, "sqlite+aiosqlite:///a.db")
    assert embedded.key_file == Path("/x/secrets.key") and not embedded.keys
    assert NEW not in repr(SecretsSettings(keys=(NEW,)))


def test_the_key_file_is_generated_once_private(tmp_path: Path) -> None:
    path = tmp_path / "var" / "secrets.key"
    keys: list[str] = []
    barrier = threading.Barrier(4)

    def make() -> None:
        barrier.wait()
        keys.append(key_file_secret(path))

    threads = [threading.Thread(target=make) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(keys)) == 1 and len(keys[0]) == 64  # one winner, read by all
    assert path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["secrets.key"]  # no temporary left
    box = load_box(SecretsSettings(key_file=path))
    assert box.fingerprints == SecretBox([keys[0]]).fingerprints  # the content works as the env


def test_a_key_file_others_can_read_or_plant_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "secrets.key"
    key_file_secret(path)
    path.chmod(0o644)
    with pytest.raises(SecretsKeyError, match="mode must be 0600"):
        key_file_secret(path)
    link = tmp_path / "link.key"
    path.chmod(0o600)
    os.symlink(path, link)
    with pytest.raises(SecretsKeyError, match="cannot open the key file"):
        key_file_secret(link)
    bad = tmp_path / "bad.key"
    bad.write_text("not a key\n")
    bad.chmod(0o600)
    with pytest.raises(SecretsKeyError, match="not a key file"):
        key_file_secret(bad)
