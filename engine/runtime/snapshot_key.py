"""The installation's secret key for KV snapshots' MAC (engine/runtime/snapshot.py).

Either given (``KVGATE_KV_SNAPSHOT_KEY``: at least ``MIN_SECRET_CHARS`` characters, hashed to 32
bytes), or generated once into ``<snapshot dir>/snapshot.key``: 32 random bytes, mode 0600,
written to a private temporary file and linked into place, so workers sharing the directory that
start together all end up with the one file that won. A key file is used only when it is a
regular file (not a link), owned by this process's user, readable by nobody else, and 32 bytes
long: another user who can write the directory can remove it but cannot plant their own (it
would be theirs), and without the key nobody can write a snapshot this engine accepts.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
import tempfile
from pathlib import Path

KEY_FILE = "snapshot.key"
KEY_BYTES = 32
MIN_SECRET_CHARS = 32


class SnapshotKeyError(Exception):
    """No usable key: snapshots are off (the engine runs without them)."""


def key_from_secret(secret: str) -> bytes:
    if len(secret) < MIN_SECRET_CHARS:
        raise SnapshotKeyError(f"the snapshot key needs at least {MIN_SECRET_CHARS} characters")
    digest = hashlib.blake2b(secret.encode(), digest_size=KEY_BYTES, person=b"kvgate-snap-key")
    return digest.digest()


def _read_key(path: Path) -> bytes:
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise SnapshotKeyError(f"{path}: cannot open ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise SnapshotKeyError(f"{path}: not a regular file owned by this user")
        if st.st_mode & 0o077:
            raise SnapshotKeyError(f"{path}: readable or writable by others (mode must be 0600)")
        key = f.read(KEY_BYTES + 1)
    if len(key) != KEY_BYTES:
        raise SnapshotKeyError(f"{path}: not a {KEY_BYTES}-byte key")
    return key


def _create_key(path: Path) -> None:
    """Write a new key at ``path`` unless one appears there first (then that one is kept)."""
    fd, tmp = tempfile.mkstemp(prefix=".key-", dir=path.parent)  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(KEY_BYTES))
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)  # atomic, and never replaces an existing key
    except FileExistsError:
        pass
    finally:
        Path(tmp).unlink(missing_ok=True)


def snapshot_key(directory: str | Path, secret: str | None) -> bytes:
    """The MAC key: from ``secret`` when given, else the key file of ``directory``."""
    if secret:
        return key_from_secret(secret)
    directory = Path(directory)
    path = directory / KEY_FILE
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not path.exists() and not path.is_symlink():
            _create_key(path)
    except OSError as exc:
        raise SnapshotKeyError(f"{path}: cannot create ({exc.strerror})") from None
    return _read_key(path)
