from __future__ import annotations

import hashlib

import pytest

from tenants.errors import ConfigError
from tenants.settings import DEFAULT_DATABASE_URL, DEFAULT_LIMITS, Limits, TenantStoreSettings


def test_defaults_from_empty_env() -> None:
    s = TenantStoreSettings.from_env({})
    assert s.database_url == DEFAULT_DATABASE_URL == "sqlite+aiosqlite:///./var/kvgate.db"
    assert s.default_limits == DEFAULT_LIMITS
    assert s.admin_token_sha256 is None and s.redis_url is None


def test_reads_variables_and_hashes_token() -> None:
    token = "a-long-admin-token-1234"
    s = TenantStoreSettings.from_env(
        {
            "KVGATE_DATABASE_URL": "postgresql+asyncpg://u@h/db",
            "KVGATE_ADMIN_TOKEN": token,
            "KVGATE_REDIS_URL": "redis://r:6379/0",
            "KVGATE_DEFAULT_RPM": "10",
            "KVGATE_DEFAULT_MAX_OUTPUT_TOKENS": "64",
        }
    )
    assert s.database_url == "postgresql+asyncpg://u@h/db"
    assert s.admin_token_sha256 == hashlib.sha256(token.encode()).hexdigest()
    assert token not in repr(s) and s.admin_token_sha256 not in repr(s)
    assert s.default_limits == Limits(10, DEFAULT_LIMITS.tpm, DEFAULT_LIMITS.max_concurrency, 64)
    assert s.redis_url == "redis://r:6379/0"


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"KVGATE_DATABASE_URL": "mysql://x"}, "KVGATE_DATABASE_URL"),
        ({"KVGATE_ADMIN_TOKEN": "short"}, "KVGATE_ADMIN_TOKEN"),
        ({"KVGATE_ADMIN_TOKEN_SHA256": "xyz"}, "KVGATE_ADMIN_TOKEN_SHA256"),
        ({"KVGATE_DEFAULT_TPM": "many"}, "KVGATE_DEFAULT_TPM"),
        ({"KVGATE_DEFAULT_MAX_CONCURRENCY": "0"}, "KVGATE_DEFAULT_MAX_CONCURRENCY"),
        ({"KVGATE_KEY_LAST_USED_FLUSH_S": "-1"}, "KVGATE_KEY_LAST_USED_FLUSH_S"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError) as err:
        TenantStoreSettings.from_env(env)
    assert err.value.variable == variable and variable in str(err.value)


def test_settings_are_frozen() -> None:
    s = TenantStoreSettings()
    with pytest.raises(AttributeError):
        s.database_url = "x"  # type: ignore[misc]
