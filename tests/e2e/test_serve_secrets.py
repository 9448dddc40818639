"""``kvgate serve`` and the secrets key: the embedded default generates ``var/secrets.key``
(0600) and stores the tool signing secret sealed; a start with another key fails with one
message naming KVGATE_SECRETS_KEY (exit 1, no traceback); ``kvgate secrets rotate`` moves the
secrets to a new key, which then starts alone."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import aiohttp

from tenants.sealing import SecretBox
from tests.e2e.servers import KVGATE, ServeProcess

ADMIN = "e2e-admin-token-0123456789"
NEW_KEY = "the-new-secrets-key-" + "d" * 32
TOOL = {
    "type": "function",
    "function": {"name": "lookup", "parameters": {"type": "object"}},
    "source": {"webhook": "https://hooks.example.com/x"},
}


async def _admin(
    http: aiohttp.ClientSession, url: str, method: str, path: str, body: object
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with http.request(method, f"{url}/admin/v1{path}", json=body, headers=headers) as r:
        assert r.status < 300, await r.text()
        return dict(await r.json())


async def _exit_code(server: ServeProcess, timeout: float = 120) -> int:
    assert server.proc is not None
    async with asyncio.timeout(timeout):
        while server.proc.poll() is None:
            await asyncio.sleep(0.1)
    return server.proc.returncode


def _stored(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        return str(conn.execute("SELECT tool_secret FROM tenants").fetchone()[0])


async def _secrets_cli(tmp_path: Path, key: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**ServeProcess(tmp_path, {"KVGATE_SECRETS_KEY": key}).env}
    return await asyncio.to_thread(
        subprocess.run,
        [*KVGATE, "secrets", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_the_embedded_key_a_wrong_key_and_a_rotation(tmp_path: Path) -> None:
    first = ServeProcess(tmp_path, {"KVGATE_ADMIN_TOKEN": ADMIN})
    first.start()
    try:
        await first.wait_ready()
        async with aiohttp.ClientSession() as http:
            await _admin(http, first.url, "POST", "/tenants", {"id": "acme", "name": "Acme"})
            body = {"text": "hi", "tools": [TOOL]}
            made = await _admin(http, first.url, "PUT", "/tenants/acme/system-prompt", body)
    finally:
        await first.stop()
    secret = made["webhook_secret"]
    key_file = tmp_path / "var" / "secrets.key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    file_key = key_file.read_text().strip()
    db = tmp_path / "var" / "kvgate.db"
    assert secret not in _stored(db) and SecretBox([file_key]).unseal(_stored(db)) == secret

    wrong = ServeProcess(tmp_path, {"KVGATE_ADMIN_TOKEN": ADMIN, "KVGATE_SECRETS_KEY": NEW_KEY})
    wrong.start()
    assert await _exit_code(wrong) == 1
    out = wrong.read_output()
    fingerprint = SecretBox([file_key]).current
    message = "kvgate serve: KVGATE_SECRETS_KEY: this database's secrets are sealed under key"
    assert f"{message} {fingerprint}" in out, out
    assert "Traceback" not in out

    rotated = await _secrets_cli(tmp_path, f"{NEW_KEY},{file_key}", "rotate")
    assert rotated.returncode == 0 and "1 tool secrets" in rotated.stdout, rotated.stderr
    assert SecretBox([NEW_KEY]).unseal(_stored(db)) == secret
    status = await _secrets_cli(tmp_path, NEW_KEY, "status")
    assert status.returncode == 0 and "a gateway starts with these keys" in status.stdout

    after = ServeProcess(tmp_path, {"KVGATE_ADMIN_TOKEN": ADMIN, "KVGATE_SECRETS_KEY": NEW_KEY})
    after.start()
    try:
        await after.wait_ready()
        async with aiohttp.ClientSession() as http:
            out2 = await _admin(http, after.url, "POST", "/tenants/acme/tool-secret/rotate", {})
    finally:
        await after.stop()
    assert SecretBox([NEW_KEY]).unseal(_stored(db)) == out2["webhook_secret"] != secret
