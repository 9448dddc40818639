"""KVGATE_WORKER_TOKEN: at least 32 characters, refused at start-up with an error that names the
variable and never quotes the token (unset, `kvgate serve` generates one for its local worker)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.settings import WORKER_TOKEN_MIN, Settings, SettingsError
from tests.cluster.workers import TOKEN

ROOT = Path(__file__).resolve().parents[2]
SHORT = "kvgate-compose-worker-token"  # the well-known token compose used to default to


def test_short_tokens_are_refused_naming_the_variable() -> None:
    with pytest.raises(SettingsError) as exc:
        Settings.from_env({"KVGATE_WORKER_TOKEN": SHORT})
    message = str(exc.value)
    assert (
        message.startswith("KVGATE_WORKER_TOKEN:") and f"{WORKER_TOKEN_MIN} characters" in message
    )
    assert SHORT not in message and "openssl rand -hex 32" in message
    token = "x" * WORKER_TOKEN_MIN
    assert Settings.from_env({"KVGATE_WORKER_TOKEN": token}).cluster.worker_token == token
    assert Settings.from_env({}).cluster.worker_token is None
    assert len(TOKEN) >= WORKER_TOKEN_MIN  # the tests' own workers


def test_kvgate_worker_refuses_to_start_with_a_short_token(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KVGATE_WORKER_TOKEN": SHORT}
    env["KVGATE_VAR_DIR"] = str(tmp_path)
    run = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "worker", "--port", "0"],
        env=env,
        capture_output=True,
        timeout=60,
    )
    err = run.stderr.decode()
    assert run.returncode == 2, err
    assert "configuration error: KVGATE_WORKER_TOKEN" in err and SHORT not in err
