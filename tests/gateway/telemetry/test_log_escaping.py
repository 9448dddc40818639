"""Client strings cannot forge or recolour log lines: a chat request whose ``user`` holds a
newline, a made-up log line and ANSI escapes logs one line with those characters escaped, in the
console format and in JSON (a real gateway in a process of its own, logging configured as
``kvgate serve`` does)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.telemetry.logs import escape_control_chars, escape_controls

ROOT = Path(__file__).resolve().parents[3]
FORGED = "2026-12-01T00:00:00Z [info     ] admin_token_rotated actor=root"
# One with a newline and spaces; one with none of the characters the console format quotes a
# value for (space, =, quotes, \n, \r, \t), so only the escaping stands between it and the terminal.
USERS = (
    f"mallory\n{FORGED}\r\x1b[31mred\x1b[0m\u2028\u202eevil",
    "mallory\x1b[2K\x1b[31m\x85\x0bforged\u2028line",
)

SCRIPT = """
import asyncio, sys
from pathlib import Path
from gateway.settings import TelemetrySettings
from gateway.telemetry import configure_logging
import structlog, logging

db, var, mode, model, users = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
configure_logging(TelemetrySettings("info", mode == "json", "test", None))
from tests.gateway.harness import live_gateway, make_settings

async def main():
    settings = make_settings(db, Path(var), KVGATE_LOG_JSON=str(mode == "json").lower())
    async with live_gateway(settings, Path(model)) as gw:
        t = await gw.create_tenant("logs")
        client = gw.openai(t.key)
        msgs = [{"role": "user", "content": "hi"}]
        for user in users:
            await client.chat.completions.create(
                model=gw.state.model_name, messages=msgs, max_tokens=2, user=user
            )
            logging.getLogger("some.library").warning("lib says %s", user)
    # leaving the context shut the gateway down: the request's log line is written

asyncio.run(main())
"""


def test_escape_controls_writes_every_unsafe_character_as_an_escape() -> None:
    assert escape_controls("a\nb\r\tc\x1b[31m\x00\x7f\x85\u2028\u2029\u202e\u2066") == (
        "a\\nb\\r\\tc\\x1b[31m\\x00\\x7f\\x85\\u2028\\u2029\\u202e\\u2066"
    )
    assert escape_controls("plain text, ünïcode ✓") == "plain text, ünïcode ✓"
    event = {"event": "x", "end_user": "a\nb", "nested": {"k\n": ["v\x1b"]}, "n": 3}
    assert escape_control_chars(None, "info", event) == {
        "event": "x",
        "end_user": "a\\nb",
        "nested": {"k\\n": ["v\\x1b"]},
        "n": 3,
    }
    trace = {"event": "x", "exception": "Traceback:\n  File x\nValueError: a\nb\x1b"}
    assert escape_control_chars(None, "error", trace)["exception"] == (
        "Traceback:\n    File x\n  ValueError: a\n  b\\x1b"
    )


@pytest.mark.parametrize("mode", ["console", "json"])
def test_a_hostile_user_field_logs_one_escaped_line(
    mode: str, gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [gateway_database, str(tmp_path), mode, str(demo_model_dir), *USERS]
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args], env=env, capture_output=True, timeout=120
    )
    out = run.stdout.decode()
    assert run.returncode == 0, out + run.stderr.decode()
    assert not set(out) & set("\x1b\r\x0b\x85\u2028\u202e"), out
    lines = out.split("\n")
    assert not any(line.startswith(FORGED) for line in lines), out
    chat = [line for line in lines if "chat_request" in line]
    assert len(chat) == len(USERS), out
    for line, user in zip(chat, USERS, strict=True):
        escaped = escape_controls(user)
        if mode == "json":
            assert json.loads(line)["end_user"] == escaped
        else:  # a value with spaces is then quoted (Python repr) by the console format
            assert f"end_user={escaped!r}" in line or f"end_user={escaped} " in line, line
    lib = [line for line in lines if line.startswith("lib says")]
    assert lib == [f"lib says {escape_controls(u)}" for u in USERS]
