"""Configuration: environment over TOML over defaults; bad values name their variable."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from engine.config import EngineConfig
from gateway.commands.serve import admin_token_env
from gateway.settings import VARIABLES, Settings, SettingsError, configuration_table


def test_defaults_are_the_embedded_setup() -> None:
    s = Settings.from_env({})
    assert s.server.port == 8000 and s.server.host == "127.0.0.1"
    assert s.tenants.database_url == "sqlite+aiosqlite:///var/kvgate.db"
    assert s.ratelimit.redis_url is None and s.ratelimit.fail_open
    assert s.model.path is None and s.telemetry.otlp_endpoint is None


def test_toml_file_then_environment(tmp_path: Path) -> None:
    cfg = tmp_path / "kvgate.toml"
    cfg.write_text(
        'port = 9001\nredis_url = "redis://r:6379/0"\n'
        "[limits]\ndefault_rpm = 42\n[model]\nblock_size = 32\nlog_json = false\n"
    )
    s = Settings.from_env({"KVGATE_CONFIG": str(cfg), "KVGATE_PORT": "9002"})
    assert s.server.port == 9002  # the environment wins
    assert s.ratelimit.redis_url == "redis://r:6379/0"
    assert s.tenants.default_limits.rpm == 42 and s.tenants.redis_url == "redis://r:6379/0"
    assert s.model.block_size == 32 and s.telemetry.log_json is False
    assert s.model.engine_overrides()["block_size"] == 32


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"KVGATE_PORT": "eighty"}, "KVGATE_PORT"),
        ({"KVGATE_PORT": "70000"}, "KVGATE_PORT"),
        ({"KVGATE_PIN_CAP_FRACTION": "1.5"}, "KVGATE_PIN_CAP_FRACTION"),
        ({"KVGATE_RATELIMIT_FAIL_MODE": "sometimes"}, "KVGATE_RATELIMIT_FAIL_MODE"),
        ({"KVGATE_LOG_JSON": "perhaps"}, "KVGATE_LOG_JSON"),
        ({"KVGATE_REDIS_TIMEOUT_S": "0"}, "KVGATE_REDIS_TIMEOUT_S"),
        ({"KVGATE_DEFAULT_MAX_TOKENS": "0"}, "KVGATE_DEFAULT_MAX_TOKENS"),
        ({"KVGATE_DATABASE_URL": "mysql://x"}, "KVGATE_DATABASE_URL"),
        ({"KVGATE_DEFAULT_TPM": "lots"}, "KVGATE_DEFAULT_TPM"),
        ({"KVGATE_ADMIN_TOKEN": "short"}, "KVGATE_ADMIN_TOKEN"),
        ({"KVGATE_CONFIG": "/nonexistent/kvgate.toml"}, "KVGATE_CONFIG"),
        ({"KVGATE_BACKEND": "sglang"}, "KVGATE_BACKEND"),
    ],
)
def test_bad_values_fail_naming_the_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(SettingsError) as err:
        Settings.from_env(env)
    assert str(err.value).startswith(variable)


def test_unknown_toml_key_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "kvgate.toml"
    cfg.write_text("prot = 1\n")
    with pytest.raises(SettingsError, match="KVGATE_CONFIG: unknown setting 'prot'"):
        Settings.from_env({"KVGATE_CONFIG": str(cfg)})


def test_admin_token_is_not_in_the_settings_repr() -> None:
    s = Settings.from_env({"KVGATE_ADMIN_TOKEN": "secret-admin-token-123"})
    assert s.auth.admin_token == "secret-admin-token-123"
    assert "secret-admin-token-123" not in repr(s)


def test_settings_are_frozen() -> None:
    s = Settings.from_env({})
    with pytest.raises(AttributeError):
        s.server.port = 1  # type: ignore[misc]


def test_configuration_table_lists_every_variable() -> None:
    table = configuration_table()
    for var in VARIABLES:
        assert f"`{var.name}`" in table


def test_admin_token_is_generated_once_then_remembered(tmp_path: Path) -> None:
    env, token = admin_token_env({}, tmp_path)
    assert token is not None and len(token) > 30
    sha = env["KVGATE_ADMIN_TOKEN_SHA256"]
    env2, token2 = admin_token_env({}, tmp_path)
    assert token2 is None and env2["KVGATE_ADMIN_TOKEN_SHA256"] == sha
    assert Settings.from_env(env2).tenants.admin_token_sha256 == sha
    env3, token3 = admin_token_env({"KVGATE_ADMIN_TOKEN": "x" * 20}, tmp_path)
    assert token3 is None and "KVGATE_ADMIN_TOKEN_SHA256" not in env3


def test_every_engine_knob_is_one_variable_checked_by_the_engine() -> None:
    """Each EngineConfig field is a KVGATE_<FIELD> variable with the field's default; a value
    the engine refuses is refused at start, naming the variable (one check: EngineConfig's)."""
    declared = {v.name: v for v in VARIABLES}
    engine = Settings.from_env({}).model.engine
    for f in dataclasses.fields(EngineConfig):
        var = declared[f"KVGATE_{f.name.upper()}"]
        assert var.meaning == f.metadata["help"] or f.name == "kv_snapshot_dir", f.name
        if f.name != "kv_snapshot_dir":  # the gateway's default: under KVGATE_VAR_DIR
            assert getattr(engine, f.name) == f.default, f.name
    env = {"KVGATE_MAX_NUM_BATCHED_TOKENS": "2048", "KVGATE_SCHEDULING": "fcfs"}
    chosen = Settings.from_env(env).model.engine
    assert chosen.max_num_batched_tokens == 2048 and chosen.scheduling == "fcfs"
    for name, bad in (("KVGATE_BLOCK_SIZE", "24"), ("KVGATE_SCHEDULING", "lottery")):
        with pytest.raises(SettingsError, match=f"^{name}: "):
            Settings.from_env({name: bad})


SOURCES = ("engine", "gateway", "tenants")


def test_every_variable_the_code_reads_is_declared_and_documented() -> None:
    """No KVGATE_* name in the code that the settings reference (README and
    docs/operations.md, both generated from VARIABLES) does not list."""
    root = Path(__file__).resolve().parents[2]
    named = {
        m
        for pkg in SOURCES
        for path in (root / pkg).rglob("*.py")
        for m in re.findall(r"\bKVGATE_[A-Z0-9_]*[A-Z0-9]\b", path.read_text())
    }
    declared = {v.name for v in VARIABLES}
    assert named - declared == set(), "read but not declared in gateway/settings.py"
    reference = (root / "docs" / "operations.md").read_text()
    assert configuration_table().strip() in reference, (
        "docs/operations.md's settings reference differs from gateway.settings.VARIABLES; paste "
        "`python -c 'from gateway.settings import configuration_table as t; print(t())'`"
    )
