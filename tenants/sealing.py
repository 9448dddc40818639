"""Secrets at rest: the tenant store keeps MCP servers' bearer tokens and tenants' tool signing
secrets sealed under the installation's secrets key, never in clear.

    stored value   "kvs1:" + Fernet token (AES-128-CBC, then HMAC-SHA256 over it all;
                   `cryptography`'s Fernet, a maintained implementation)
    keys           KVGATE_SECRETS_KEY = "NEW[,OLD,...]": each at least 32 characters, hashed to
                   a Fernet key; the first seals, every one opens (MultiFernet), so a new key is
                   rolled out while the old ones still open what they sealed, and
                   `kvgate secrets rotate` reseals everything under the first
    fingerprint    12 hex digits of a keyed hash of a key: names it in errors and in the
                   ``secret_keys`` table (tenants/secret_store.py) and says nothing of it

Fernet checks the MAC before it decrypts: a value opened with the wrong key is an error
(``SecretUnreadable``), never garbage. Where the key comes from: tenants/secret_keys.py.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from tenants.errors import ConfigError, TenantStoreError

PREFIX = "kvs1:"
VARIABLE = "KVGATE_SECRETS_KEY"
MIN_SECRET_CHARS = 32
PROBE = "kvgate secrets key probe"  # sealed per key in secret_keys: proves a key is the one


class SecretsKeyError(ConfigError):
    """No usable secrets key, or not the one the database's secrets are sealed under. Fails
    start-up with one message naming KVGATE_SECRETS_KEY."""

    def __init__(self, message: str) -> None:
        super().__init__(VARIABLE, message)


class SecretUnreadable(TenantStoreError):
    """A stored secret that no key of the ring opens (or one that is not sealed)."""


def fingerprint(secret: str) -> str:
    return hashlib.blake2b(secret.encode(), digest_size=6, person=b"kvgate-secret-fp").hexdigest()


def _fernet_key(secret: str) -> bytes:
    digest = hashlib.blake2b(secret.encode(), digest_size=32, person=b"kvgate-secrets")
    return base64.urlsafe_b64encode(digest.digest())


def parse_keys(raw: str) -> tuple[str, ...]:
    """KVGATE_SECRETS_KEY's list: comma-separated, the sealing key first."""
    keys = tuple(k.strip() for k in raw.split(","))
    for n, key in enumerate(keys, 1):
        if len(key) < MIN_SECRET_CHARS:
            raise SecretsKeyError(
                f"key {n} of {len(keys)} has fewer than {MIN_SECRET_CHARS} characters "
                "(make one with `openssl rand -hex 32`)"
            )
    if len(set(keys)) != len(keys):
        raise SecretsKeyError("a key is listed twice")
    return keys


def is_sealed(value: str) -> bool:
    return value.startswith(PREFIX)


def _token(stored: str) -> bytes:
    if not is_sealed(stored):
        raise SecretUnreadable("a stored secret is not sealed (run `kvgate migrate`)")
    return stored[len(PREFIX) :].encode("ascii")


class SecretBox:
    """A ring of keys: ``seal`` under the first, ``unseal`` with any."""

    def __init__(self, secrets: Sequence[str]) -> None:
        if not secrets:
            raise SecretsKeyError("no key given")
        self._by_print = {fingerprint(s): Fernet(_fernet_key(s)) for s in secrets}
        self._ring = MultiFernet(list(self._by_print.values()))
        self.fingerprints = tuple(self._by_print)

    def __repr__(self) -> str:
        return f"SecretBox(fingerprints={self.fingerprints})"

    @property
    def current(self) -> str:
        """The fingerprint of the sealing key."""
        return self.fingerprints[0]

    def seal(self, clear: str) -> str:
        return PREFIX + self._ring.encrypt(clear.encode()).decode("ascii")

    def unseal(self, stored: str) -> str:
        try:
            return self._ring.decrypt(_token(stored)).decode()
        except InvalidToken:
            raise SecretUnreadable(self._unreadable()) from None

    def reseal(self, stored: str) -> str:
        """``stored`` sealed again under the first key."""
        try:
            return PREFIX + self._ring.rotate(_token(stored)).decode("ascii")
        except InvalidToken:
            raise SecretUnreadable(self._unreadable()) from None

    def opens(self, key_print: str, stored: str) -> bool:
        """Whether the key of fingerprint ``key_print`` is in the ring and opens ``stored``."""
        fernet = self._by_print.get(key_print)
        if fernet is None:
            return False
        try:
            fernet.decrypt(_token(stored))
        except (InvalidToken, SecretUnreadable):
            return False
        return True

    def _unreadable(self) -> str:
        return (
            "a stored secret opens with no key of KVGATE_SECRETS_KEY "
            f"(fingerprints {', '.join(self.fingerprints)})"
        )
