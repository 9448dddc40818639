"""Frozen settings of the tenant store, built once from the environment by the gateway.

Nothing here reads ``os.environ`` at import: callers pass the mapping to ``from_env``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from tenants.db import redact_url
from tenants.errors import ConfigError
from tenants.secret_keys import SecretsSettings

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///./var/kvgate.db"
DEFAULT_EVENT_CHANNEL = "kvgate:tenants"
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
_URL_SCHEMES = ("sqlite+aiosqlite://", "postgresql+asyncpg://")


@dataclass(frozen=True)
class Limits:
    """Per-tenant limits; ``None`` in a stored row means "use the default from settings"."""

    rpm: int | None = None
    tpm: int | None = None
    max_concurrency: int | None = None
    max_output_tokens: int | None = None
    # Fair share of the engine (engine/core/fairness.py): service proportional to it while
    # tenants compete; None: 1.0.
    weight: float | None = None

    def resolve(self, defaults: Limits) -> Limits:
        """Fill every ``None`` from ``defaults``."""
        return Limits(
            rpm=self.rpm if self.rpm is not None else defaults.rpm,
            tpm=self.tpm if self.tpm is not None else defaults.tpm,
            max_concurrency=(
                self.max_concurrency
                if self.max_concurrency is not None
                else defaults.max_concurrency
            ),
            max_output_tokens=(
                self.max_output_tokens
                if self.max_output_tokens is not None
                else defaults.max_output_tokens
            ),
            weight=self.weight if self.weight is not None else defaults.weight,
        )


DEFAULT_LIMITS = Limits(rpm=600, tpm=200_000, max_concurrency=16, max_output_tokens=1024)


def hash_admin_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class TenantStoreSettings:
    database_url: str = field(default=DEFAULT_DATABASE_URL, repr=False)  # may hold a password
    default_limits: Limits = DEFAULT_LIMITS
    # sha256 hex of the admin bearer token; None means the admin API refuses every request.
    admin_token_sha256: str | None = field(default=None, repr=False)
    redis_url: str | None = field(default=None, repr=False)
    event_channel: str = DEFAULT_EVENT_CHANNEL
    last_used_flush_s: float = 30.0
    # The key of secrets at rest (tenants/secret_keys.py); the default: none (not usable).
    secrets: SecretsSettings = field(default_factory=SecretsSettings)

    def __post_init__(self) -> None:
        if not self.database_url.startswith(_URL_SCHEMES):
            raise ConfigError(
                "KVGATE_DATABASE_URL",
                f"must start with one of {', '.join(_URL_SCHEMES)}; "
                f"got {redact_url(self.database_url)!r}",
            )
        sha = self.admin_token_sha256
        if sha is not None and not _SHA256_HEX.fullmatch(sha):
            raise ConfigError("KVGATE_ADMIN_TOKEN_SHA256", "must be 64 lowercase hex digits")
        for name in ("rpm", "tpm", "max_concurrency", "max_output_tokens"):
            value = getattr(self.default_limits, name)
            if value is None or value < 1:
                raise ConfigError(f"KVGATE_DEFAULT_{name.upper()}", "must be an integer >= 1")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> TenantStoreSettings:
        """Read ``KVGATE_*`` variables; a bad value raises ``ConfigError`` naming the variable.

        KVGATE_DATABASE_URL, KVGATE_ADMIN_TOKEN (plain; hashed here and never kept) or
        KVGATE_ADMIN_TOKEN_SHA256, KVGATE_REDIS_URL, KVGATE_TENANT_EVENT_CHANNEL,
        KVGATE_DEFAULT_RPM / _TPM / _MAX_CONCURRENCY / _MAX_OUTPUT_TOKENS,
        KVGATE_KEY_LAST_USED_FLUSH_S, KVGATE_SECRETS_KEY (unset with SQLite:
        <KVGATE_VAR_DIR>/secrets.key).
        """
        token = env.get("KVGATE_ADMIN_TOKEN")
        sha = env.get("KVGATE_ADMIN_TOKEN_SHA256")
        if token is not None and sha is not None:
            raise ConfigError("KVGATE_ADMIN_TOKEN", "set either it or KVGATE_ADMIN_TOKEN_SHA256")
        if token is not None:
            if len(token) < 16:
                raise ConfigError("KVGATE_ADMIN_TOKEN", "must be at least 16 characters")
            sha = hash_admin_token(token)
        elif sha is not None:
            sha = sha.strip().lower()
        defaults = Limits(
            **{
                name: _int(env, f"KVGATE_DEFAULT_{name.upper()}", getattr(DEFAULT_LIMITS, name))
                for name in ("rpm", "tpm", "max_concurrency", "max_output_tokens")
            }
        )
        flush_s = _float(env, "KVGATE_KEY_LAST_USED_FLUSH_S", 30.0)
        url = env.get("KVGATE_DATABASE_URL", DEFAULT_DATABASE_URL)
        return cls(
            database_url=url,
            default_limits=defaults,
            admin_token_sha256=sha,
            redis_url=env.get("KVGATE_REDIS_URL") or None,
            event_channel=env.get("KVGATE_TENANT_EVENT_CHANNEL", DEFAULT_EVENT_CHANNEL),
            last_used_flush_s=flush_s,
            secrets=SecretsSettings.from_env(env, url),
        )


def _int(env: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = env.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(name, f"must be an integer, got {raw!r}") from None
    if value < 1:
        raise ConfigError(name, f"must be >= 1, got {value}")
    return value


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(name, f"must be a number, got {raw!r}") from None
    if value <= 0:
        raise ConfigError(name, f"must be > 0, got {value}")
    return value
