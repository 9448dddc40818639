"""The operator CLI, run in-process through ``gateway.cli.main`` (as the console script does)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main
from tenants.store import TenantStore
from tests.conftest import service_unavailable


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture
def cli_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("KVGATE_DATABASE_URL", url)
    monkeypatch.delenv("KVGATE_REDIS_URL", raising=False)
    return url


async def _audit_actions(url: str, tenant_id: str) -> list[tuple[str, str]]:
    store = TenantStore.open(url)
    try:
        page = await store.list_audit(tenant_id=tenant_id)
        return [(a.actor, a.action) for a in reversed(page.data)]
    finally:
        await store.aclose()


def test_cli_refuses_unmigrated_then_full_workflow(
    cli_db: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rc, _, err = _run(capsys, "tenants", "list")
    assert rc == 1 and "kvgate migrate" in err
    assert _run(capsys, "migrate")[0] == 0
    rc, out, _ = _run(
        capsys, "tenants", "create", "acme", "--name", "Acme", "--prompt", "Hi", "--rpm", "5"
    )
    assert rc == 0 and '"prompt_version": 1' in out and "cache_salt" not in out
    prompt = tmp_path / "p.txt"
    prompt.write_text("Second prompt", encoding="utf-8")
    rc, out, _ = _run(capsys, "tenants", "set-prompt", "acme", "--file", str(prompt))
    assert rc == 0 and "version 2" in out
    rc, out, _ = _run(
        capsys, "tenants", "create-key", "acme", "--kind", "widget", "--origin", "https://a.example"
    )
    assert rc == 0
    key_id = out.split("key id:")[1].split()[0]
    key = out.split("key:")[1].split()[0]
    assert key.startswith("kvg_")
    rc, out, _ = _run(capsys, "tenants", "show", "acme")
    assert rc == 0 and key_id in out and key not in out and "https://a.example" in out
    rc, out, _ = _run(capsys, "tenants", "set-limits", "acme", "--tpm", "99")
    assert rc == 0 and '"tpm": 99' in out and '"rpm": 5' in out  # only the limits given
    assert _run(capsys, "tenants", "revoke-key", "acme", key_id)[0] == 0
    rc, out, _ = _run(capsys, "tenants", "list")
    assert rc == 0 and "acme" in out and "active" in out
    assert asyncio.run(_audit_actions(cli_db, "acme")) == [
        ("cli", "tenant.create"),
        ("cli", "prompt.set"),
        ("cli", "key.create"),
        ("cli", "limits.set"),
        ("cli", "key.revoke"),
    ]


def test_cli_errors(cli_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, "migrate")[0] == 0
    rc, _, err = _run(capsys, "tenants", "create", "Bad_Id", "--name", "x")
    assert rc == 1 and "id:" in err
    rc, _, err = _run(capsys, "tenants", "show", "nope")
    assert rc == 1 and "not found" in err
    assert _run(capsys, "tenants", "create", "dup", "--name", "x")[0] == 0
    rc, _, err = _run(capsys, "tenants", "create", "dup", "--name", "x")
    assert rc == 1 and "already exists" in err
    rc, _, err = _run(capsys, "tenants", "set-limits", "dup", "--rpm", "0")
    assert rc == 1 and "rpm" in err
    rc, _, err = _run(capsys, "migrate", "--database-url", "mysql://nope")
    assert rc == 2 and "KVGATE_DATABASE_URL" in err
    with pytest.raises(SystemExit) as exc:  # argparse usage error
        main(["tenants", "create-key", "dup", "--kind", "root"])
    assert exc.value.code == 2


def test_cli_announces_changes_over_redis(
    cli_db: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With KVGATE_REDIS_URL set, a CLI change reaches running gateways' event channel."""
    import json
    import secrets
    import time

    import redis

    channel = f"kvgate-test-{secrets.token_hex(6)}:tenants"
    client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    try:
        client.ping()
    except redis.ConnectionError as exc:
        service_unavailable("Redis at 127.0.0.1:6379", exc)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(channel)
    try:
        assert _run(capsys, "migrate")[0] == 0
        monkeypatch.setenv("KVGATE_REDIS_URL", "redis://127.0.0.1:6379/0")
        monkeypatch.setenv("KVGATE_TENANT_EVENT_CHANNEL", channel)
        assert _run(capsys, "tenants", "create", "acme", "--name", "A", "--prompt", "p")[0] == 0
        assert _run(capsys, "tenants", "set-prompt", "acme", "--text", "q")[0] == 0
        events = []
        deadline = time.monotonic() + 3.0
        # get_message() also returns None for the (ignored) subscribe confirmation: poll.
        while len(events) < 2 and time.monotonic() < deadline:
            msg = pubsub.get_message(timeout=0.1)
            if msg is not None:
                events.append(json.loads(msg["data"])["event"])
    finally:
        pubsub.close()
        client.close()
    core = [{k: e[k] for k in ("tenant_id", "kind", "prompt_version")} for e in events]
    assert core == [
        {"tenant_id": "acme", "kind": "created", "prompt_version": 1},
        {"tenant_id": "acme", "kind": "prompt", "prompt_version": 2},
    ]


def _json_out(out: str) -> Any:
    return json.loads(out)


def test_cli_prompt_versions_and_activation(
    cli_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(capsys, "migrate")[0] == 0
    assert _run(capsys, "tenants", "create", "acme", "--name", "A", "--prompt", "one")[0] == 0
    assert _run(capsys, "tenants", "set-prompt", "acme", "--text", "two")[0] == 0
    rc, out, _ = _run(capsys, "tenants", "prompt-versions", "acme")
    lines = out.splitlines()
    assert rc == 0 and lines[0].split()[:2] == ["VERSION", "ACTIVE"]
    assert [line.split()[0] for line in lines[1:]] == ["2", "1"]
    assert lines[1].split()[1] == "yes" and "yes" not in lines[2]
    rc, out, _ = _run(capsys, "tenants", "show-prompt", "acme", "1")
    shown = _json_out(out)
    assert rc == 0 and shown["text"] == "one" and shown["active"] is False
    rc, out, _ = _run(capsys, "tenants", "activate-prompt", "acme", "1")
    assert rc == 0 and "version 1 is active (was 2)" in out
    rc, out, _ = _run(capsys, "tenants", "activate-prompt", "acme", "1")
    assert rc == 0 and "already active" in out
    rc, _, err = _run(capsys, "tenants", "activate-prompt", "acme", "9")
    assert rc == 1 and "no system prompt version 9" in err
    rc, out, _ = _run(capsys, "tenants", "show", "acme")
    assert _json_out(out)["prompt_version"] == 1
    rc, out, _ = _run(capsys, "tenants", "audit", "--tenant", "acme", "--limit", "2")
    rows = out.splitlines()
    assert rc == 0 and len(rows) == 2
    assert rows[0].split()[2:4] == ["cli", "prompt.activate"]
    assert rows[1].split()[2:4] == ["cli", "prompt.set"]
    assert "one" not in out and "two" not in out  # digests only, never prompt text


def test_cli_status_changes(cli_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, "migrate")[0] == 0
    assert _run(capsys, "tenants", "create", "acme", "--name", "A")[0] == 0
    assert _run(capsys, "tenants", "suspend", "acme")[1] == "tenant acme is suspended\n"
    assert _run(capsys, "tenants", "resume", "acme")[1] == "tenant acme is active\n"
    assert _run(capsys, "tenants", "delete", "acme")[1] == "tenant acme is deleted\n"
    rc, out, _ = _run(capsys, "tenants", "list")
    assert rc == 0 and "acme" not in out
    rc, _, err = _run(capsys, "tenants", "suspend", "acme")
    assert rc == 0  # suspending a deleted tenant restores nothing but is allowed as a status
    assert asyncio.run(_audit_actions(cli_db, "acme"))[-1] == ("cli", "tenant.update")
    rc, _, err = _run(capsys, "tenants", "delete", "ghost")
    assert rc == 1 and "not found" in err


def test_cli_set_policy_changes_only_what_it_is_given(
    cli_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(capsys, "migrate")[0] == 0
    assert _run(capsys, "tenants", "create", "acme", "--name", "A")[0] == 0
    rc, out, _ = _run(
        capsys, "tenants", "set-policy", "acme", "--vllm-visitor-salt", "on",
        "--conversation-store", "off", "--conversation-retention-days", "7",
    )  # fmt: skip
    shown = json.loads(out)
    assert rc == 0 and shown["vllm_visitor_salt"] is True and shown["conversation_store"] is False
    assert shown["conversation_retention_days"] == 7 and shown["allow_client_system"] is True
    rc, out, _ = _run(capsys, "tenants", "set-policy", "acme", "--client-system", "off")
    shown = json.loads(out)
    assert rc == 0 and shown["allow_client_system"] is False and shown["vllm_visitor_salt"]
    assert asyncio.run(_audit_actions(cli_db, "acme"))[-1] == ("cli", "tenant.update")
    rc, _, err = _run(capsys, "tenants", "set-policy", "acme")
    assert rc == 2 and "nothing to change" in err
    rc, _, err = _run(
        capsys, "tenants", "set-policy", "acme", "--conversation-retention-days", "-1"
    )
    assert rc == 1 and "conversation_retention_days" in err  # invalid values: as set-limits
    rc, _, err = _run(capsys, "tenants", "set-policy", "ghost", "--name", "G")
    assert rc == 1 and "not found" in err


def test_cli_keys_with_limits(cli_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, "migrate")[0] == 0
    assert _run(capsys, "tenants", "create", "acme", "--name", "A")[0] == 0
    rc, out, _ = _run(capsys, "tenants", "create-key", "acme", "--kind", "server", "--rpm", "7")
    assert rc == 0
    key_id, key = out.split("key id:")[1].split()[0], out.split("key:")[1].split()[0]
    rc, out, _ = _run(capsys, "tenants", "list-keys", "acme")
    keys = _json_out(out)
    assert rc == 0 and key not in out
    assert [(k["id"], k["limits"]) for k in keys] == [
        (key_id, {"rpm": 7, "tpm": None, "max_concurrency": None})
    ]
    rc, out, _ = _run(
        capsys,
        "tenants",
        "set-key-limits",
        "acme",
        key_id,
        "--tpm",
        "900",
        "--max-concurrency",
        "2",
    )
    assert rc == 0 and _json_out(out) == {"rpm": None, "tpm": 900, "max_concurrency": 2}
    rc, _, err = _run(capsys, "tenants", "set-key-limits", "acme", key_id, "--rpm", "0")
    assert rc == 1 and "rpm" in err
    with pytest.raises(SystemExit):  # keys have no output cap of their own
        main(["tenants", "create-key", "acme", "--kind", "server", "--max-output-tokens", "5"])


def test_cli_set_limits_merges_unless_replace(
    cli_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(capsys, "migrate")[0] == 0
    create = ("tenants", "create", "acme", "--name", "A", "--rpm", "5", "--tpm", "50")
    assert _run(capsys, *create)[0] == 0
    rc, out, _ = _run(capsys, "tenants", "set-limits", "acme", "--max-concurrency", "3")
    assert rc == 0
    assert _json_out(out) == {
        "rpm": 5,
        "tpm": 50,
        "max_concurrency": 3,
        "max_output_tokens": None,
        "weight": None,
    }
    rc, out, _ = _run(capsys, "tenants", "set-limits", "acme", "--replace", "--tpm", "70")
    assert rc == 0
    assert _json_out(out) == {
        "rpm": None,
        "tpm": 70,
        "max_concurrency": None,
        "max_output_tokens": None,
        "weight": None,
    }
    rc, out, _ = _run(capsys, "tenants", "set-limits", "acme", "--weight", "2.5")
    assert rc == 0 and _json_out(out)["weight"] == 2.5


def test_cli_help_says_what_the_server_does(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["tenants", "create", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "the server rejects (400) chat requests that carry system or developer messages" in text
