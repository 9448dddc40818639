"""``kvgate tenants set-prompt --tools-file``: a version with tools from the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli import main


def test_set_prompt_with_a_tools_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KVGATE_DATABASE_URL", f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}")
    monkeypatch.setenv("KVGATE_VAR_DIR", str(tmp_path / "var"))  # its secrets.key: SQLite's
    monkeypatch.delenv("KVGATE_SECRETS_KEY", raising=False)
    monkeypatch.delenv("KVGATE_REDIS_URL", raising=False)
    assert main(["migrate"]) == 0
    assert main(["tenants", "create", "acme", "--name", "Acme"]) == 0
    tool = {
        "type": "function",
        "function": {"name": "lookup", "parameters": {"type": "object"}},
        "source": {"webhook": "https://hooks.example.com/x"},
    }
    spec = tmp_path / "tools.json"
    spec.write_text(json.dumps({"tools": [tool], "max_tool_rounds": 2}))
    capsys.readouterr()
    rc = main(["tenants", "set-prompt", "acme", "--prompt", "Hi", "--tools-file", str(spec)])
    out = capsys.readouterr().out
    assert rc == 0 and "version 1 is active (1 tools)" in out and "signing secret" in out
    assert main(["tenants", "show-prompt", "acme", "1"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["tools"] == [tool] and shown["max_tool_rounds"] == 2
    spec.write_text(json.dumps([{**tool, "function": {"name": "bad name"}}]))
    rc = main(["tenants", "set-prompt", "acme", "--prompt", "Hi", "--tools-file", str(spec)])
    assert rc == 1 and "tools.0.function.name" in capsys.readouterr().err
