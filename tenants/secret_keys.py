"""Where the secrets key comes from (the key itself: tenants/sealing.py).

    KVGATE_SECRETS_KEY set        its keys, in order (the first seals)
    unset, embedded SQLite        <KVGATE_VAR_DIR>/secrets.key: 64 hex characters generated once,
                                  mode 0600, written to a private temporary file and linked into
                                  place (never replaces a key; processes starting together end up
                                  with the one file that won)
    unset, any other database     a start-up error: several gateways share that database, so the
                                  key must be the same on all of them, which a file each host
                                  makes for itself cannot be

A key file is used only when it is a regular file (not a link), owned by this process's user and
readable by nobody else: another user who can write the directory can remove it but cannot plant
their own. Its content works as KVGATE_SECRETS_KEY too (moving from SQLite to PostgreSQL: set
the variable to it).
"""

from __future__ import annotations

import os
import re
import secrets
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tenants.sealing import SecretBox, SecretsKeyError, parse_keys

KEY_FILE = "secrets.key"
_HEX_KEY = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class SecretsSettings:
    keys: tuple[str, ...] = field(default=(), repr=False)  # KVGATE_SECRETS_KEY
    key_file: Path | None = None  # used when ``keys`` is empty; None: the key must be given

    @classmethod
    def from_env(cls, env: Mapping[str, str], database_url: str) -> SecretsSettings:
        raw = env.get("KVGATE_SECRETS_KEY", "")
        if raw:
            return cls(keys=parse_keys(raw))
        if database_url.startswith("sqlite"):
            return cls(key_file=Path(env.get("KVGATE_VAR_DIR") or "var") / KEY_FILE)
        return cls()


def load_box(settings: SecretsSettings) -> SecretBox:
    """The key ring (blocking file work when it comes from the key file)."""
    if settings.keys:
        return SecretBox(settings.keys)
    if settings.key_file is None:
        raise SecretsKeyError(
            "required with a database other than the embedded SQLite file: every gateway of "
            "that database needs the same key (make one with `openssl rand -hex 32`)"
        )
    return SecretBox([key_file_secret(settings.key_file)])


def key_file_secret(path: Path) -> str:
    """The key in ``path``, generated first if there is none."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not path.exists() and not path.is_symlink():
            _create(path)
    except OSError as exc:
        raise SecretsKeyError(f"{path}: cannot create the key file ({exc.strerror})") from None
    return _read(path)


def _create(path: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".secrets-key-", dir=path.parent)  # mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)  # atomic, and never replaces an existing key
    except FileExistsError:
        pass
    finally:
        Path(tmp).unlink(missing_ok=True)


def _read(path: Path) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise SecretsKeyError(f"{path}: cannot open the key file ({exc.strerror})") from None
    with os.fdopen(fd, "r") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise SecretsKeyError(f"{path}: not a regular file owned by this user")
        if st.st_mode & 0o077:
            raise SecretsKeyError(f"{path}: readable or writable by others (mode must be 0600)")
        key = f.read(100).strip()
    if not _HEX_KEY.fullmatch(key):
        raise SecretsKeyError(f"{path}: not a key file (64 hex characters expected)")
    return key
