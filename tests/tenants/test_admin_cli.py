"""``kvgate tenants create-admin | list-admins | show-admin | revoke-admin``, in-process."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.cli import main
from tenants.admins import AdminStore
from tenants.store import TenantStore


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture
def cli_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("KVGATE_DATABASE_URL", url)
    monkeypatch.delenv("KVGATE_REDIS_URL", raising=False)
    assert main(["migrate"]) == 0
    return url


async def _resolve(url: str, token: str) -> tuple[str, str] | None:
    from tenants.admins import token_sha256

    store = TenantStore.open(url)
    try:
        found = await AdminStore(store).by_digest(token_sha256(token))
        return None if found is None else (found.scope, found.status)
    finally:
        await store.aclose()


def test_admin_commands(cli_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert _run(capsys, "tenants", "create", "acme", "--name", "Acme")[0] == 0
    rc, out, _ = _run(
        capsys, "tenants", "create-admin", "--scope", "acme", "--access", "viewer", "--name", "ci"
    )
    assert rc == 0 and "shown only this once" in out
    admin_id = out.split("admin id:")[1].split()[0]
    token = out.split("token:")[1].split()[0]
    assert asyncio.run(_resolve(cli_db, token)) == ("acme", "active")
    rc, out, _ = _run(capsys, "tenants", "list-admins")
    assert rc == 0 and admin_id in out and "viewer" in out and token not in out
    rc, out, _ = _run(capsys, "tenants", "list-admins", "--scope", "platform")
    assert rc == 0 and admin_id not in out
    rc, out, _ = _run(capsys, "tenants", "show-admin", admin_id)
    assert rc == 0 and '"created_by": "cli"' in out and token not in out
    rc, out, _ = _run(capsys, "tenants", "revoke-admin", admin_id)
    assert rc == 0 and "revoked" in out
    assert asyncio.run(_resolve(cli_db, token)) == ("acme", "revoked")


def test_admin_command_errors(cli_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _run(capsys, "tenants", "create-admin", "--scope", "ghost", "--access", "editor")
    assert rc == 1 and "scope" in err
    rc, _, err = _run(
        capsys,
        "tenants",
        "create-admin",
        "--scope",
        "platform",
        "--access",
        "editor",
        "--expires-at",
        "2000-01-01T00:00:00",
    )
    assert rc == 1 and "expires_at" in err
    rc, _, err = _run(capsys, "tenants", "revoke-admin", "adm_nope")
    assert rc == 1 and "not found" in err
