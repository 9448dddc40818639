"""What the gateway shows of itself: no database or Redis password in a configuration error (or
a settings repr), no secret value quoted by a refused setting, and the widget demo only on a
loopback address unless it is asked for."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.commands.serve import _parse_args, environment
from gateway.settings import Settings, SettingsError
from tenants.db import redact_url
from tenants.errors import ConfigError
from tenants.settings import TenantStoreSettings

ROOT = Path(__file__).resolve().parents[3]
PASSWORD = "hunter2-s3cret"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"postgresql+asyncpg://kvgate:{PASSWORD}@db:5432/kvgate", "postgresql+asyncpg://kvgate:***@db:5432/kvgate"),
        (f"redis://:{PASSWORD}@redis:6379/0", "redis://:***@redis:6379/0"),
        (f"rediss://u@h:1/0?password={PASSWORD}&db=2", "rediss://u@h:1/0?db=2&password=redacted"),
        (f"not a url {PASSWORD}", "<not a URL>"),
    ],
)  # fmt: skip
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_a_bad_database_url_is_refused_without_its_password() -> None:
    url = f"mysql://kvgate:{PASSWORD}@db/kvgate"
    with pytest.raises(ConfigError) as exc:
        TenantStoreSettings(database_url=url)
    assert PASSWORD not in str(exc.value) and "mysql://kvgate:***@db/kvgate" in str(exc.value)
    with pytest.raises(SettingsError) as err:
        Settings.from_env({"KVGATE_DATABASE_URL": url})
    assert PASSWORD not in str(err.value) and "KVGATE_DATABASE_URL" in str(err.value)


def test_settings_reprs_hold_no_url_password() -> None:
    s = Settings.from_env(
        {
            "KVGATE_DATABASE_URL": f"postgresql+asyncpg://kvgate:{PASSWORD}@db/kvgate",
            "KVGATE_REDIS_URL": f"redis://:{PASSWORD}@redis:6379/0",
        }
    )
    assert PASSWORD not in repr(s)


def test_kvgate_serve_prints_the_configuration_error_without_the_password(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "KVGATE_VAR_DIR": str(tmp_path),
        "KVGATE_DATABASE_URL": f"mysql+aiomysql://kvgate:{PASSWORD}@db/kvgate",
    }
    run = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve"], env=env, capture_output=True, timeout=60
    )
    out = (run.stdout + run.stderr).decode()
    assert run.returncode == 2, out
    assert "configuration error: KVGATE_DATABASE_URL" in out and PASSWORD not in out


@pytest.mark.parametrize(
    ("env", "demo"),
    [
        ({}, True),  # the embedded default on 127.0.0.1
        ({"KVGATE_HOST": "::1"}, True),
        ({"KVGATE_HOST": "localhost"}, True),
        ({"KVGATE_HOST": "0.0.0.0"}, False),  # reachable from elsewhere: never by itself
        ({"KVGATE_HOST": "::"}, False),
        ({"KVGATE_HOST": "10.0.0.7"}, False),
        ({"KVGATE_HOST": "gateway.internal"}, False),
        ({"KVGATE_HOST": "0.0.0.0", "KVGATE_WIDGET_DEMO": "true"}, True),  # asked for
        ({"KVGATE_WIDGET_DEMO": "false"}, False),
    ],
)
def test_the_widget_demo_turns_itself_on_only_on_loopback(env: dict[str, str], demo: bool) -> None:
    assert Settings.from_env(env).widget.demo is demo


def test_serve_host_flag_counts_as_the_listen_address() -> None:
    env = environment(_parse_args(["--host", "0.0.0.0"]), {})
    assert not Settings.from_env(env).widget.demo
    assert Settings.from_env(environment(_parse_args([]), {})).widget.demo
