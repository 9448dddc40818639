"""Egress rules and webhook calls against a real receiver on loopback: signatures verify,
failures are answers (timeout, 500, 10 MB, not JSON, redirect), loopback is refused unless
allowlisted, cookies never travel, and a failing endpoint's circuit opens."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import AsyncIterator

import pytest
from opentelemetry.trace import NoOpTracer
from prometheus_client import CollectorRegistry
from yarl import URL

from gateway.chat.tools.run.breaker import Breakers
from gateway.chat.tools.run.egress import (
    Allowlist,
    Egress,
    EgressRefused,
    check_url,
    public_address,
)
from gateway.chat.tools.run.runner import ToolRunner
from tenants.tools import TenantTool
from tests.gateway.chat.tools.tenant.webhook_server import Receiver, webhook_receiver

SECRET = "s" * 64


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    async with webhook_receiver(SECRET) as r:
        yield r


def _runner(allowed: str, *, failures: int = 3, timeout_s: float = 1.0) -> ToolRunner:
    async def secret(tenant_id: str) -> str | None:
        return SECRET if tenant_id == "acme" else None

    egress = Egress(Allowlist.parse(allowed), timeout_s=timeout_s, max_bytes=64 << 10)
    return ToolRunner(egress, Breakers(failures, 60.0), secret, NoOpTracer(), CollectorRegistry())


def _tool(url: str) -> TenantTool:
    return TenantTool("lookup", None, None, webhook=url)


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "100.64.0.1",
        "169.254.169.254",
        "0.0.0.0",
        "224.0.0.1",
        "240.0.0.1",
        "::",
        "::1",
        "fc00::1",
        "fd12::1",
        "fe80::1",
        "fec0::1",  # site-local (deprecated, still routed inside some sites)
        "fed0::1234",
        "ff02::1",
        "100::1",  # discard-only
        "2001:db8::1",  # documentation
        "5f00::1",  # outside global unicast
    ],
)
def test_non_public_addresses(address: str) -> None:
    assert not public_address(ipaddress.ip_address(address))


# Each IPv6 form that carries an IPv4 address, with a private and a public one inside: the form
# is judged by the address it carries (gateway/chat/tools/run/egress.py's table).
EMBEDDED = [
    # form                   private inside (refused)          public inside (allowed)
    ("IPv4-mapped", "::ffff:127.0.0.1", "::ffff:8.8.8.8"),
    ("IPv4-mapped", "::ffff:169.254.169.254", "::ffff:1.1.1.1"),
    ("IPv4-translated", "::ffff:0:10.0.0.1", "::ffff:0:8.8.8.8"),
    ("NAT64 well-known", "64:ff9b::10.0.0.1", "64:ff9b::8.8.8.8"),
    ("NAT64 well-known", "64:ff9b::169.254.169.254", "64:ff9b::1.1.1.1"),
    ("6to4", "2002:7f00:1::1", "2002:808:808::1"),
    ("6to4", "2002:a9fe:a9fe:1::1", "2002:101:101::1"),
    ("IPv4-compatible", "::10.0.0.1", "::8.8.8.8"),
    ("IPv4-compatible", "::127.0.0.1", "::1.1.1.1"),
    # Teredo: 2001:0:<server>:<flags>:<port ^ ffff>:<client ^ ffffffff>; both must be public
    (
        "Teredo, private client",
        "2001:0:808:808:8000:0:f5ff:fffe",
        "2001:0:808:808:8000:0:f7f7:f7f7",
    ),
    ("Teredo, private server", "2001:0:a00:1:8000:0:f7f7:f7f7", "2001:0:101:101:8000:0:f7f7:f7f7"),
]


@pytest.mark.parametrize(("form", "private", "public"), EMBEDDED)
def test_embedded_ipv4_is_judged_by_its_ipv4(form: str, private: str, public: str) -> None:
    assert not public_address(ipaddress.ip_address(private)), form
    assert public_address(ipaddress.ip_address(public)), form


def test_nat64_local_use_is_refused_whole() -> None:
    """Where the IPv4 address sits in 64:ff9b:1::/48 depends on the operator's prefix length:
    the same bits read as /96 and as /48 name different hosts, so none is allowed."""
    for address in ("64:ff9b:1::10.0.0.1", "64:ff9b:1::8.8.8.8", "64:ff9b:1:808:8:800::"):
        assert not public_address(ipaddress.ip_address(address)), address


def test_public_addresses_and_url_rules() -> None:
    assert public_address(ipaddress.ip_address("8.8.8.8"))
    assert public_address(ipaddress.ip_address("2606:4700::1111"))
    assert public_address(ipaddress.ip_address("2a00:1450:4001:80b::200e"))
    none = Allowlist()
    check_url(URL("https://hooks.example.com/x"), none)
    for bad in (
        "http://hooks.example.com/x",
        "ftp://hooks.example.com/x",
        "https://user:pw@hooks.example.com/x",
        "https://127.0.0.1/x",
        "https://[::1]/x",
        "https://169.254.169.254/latest/meta-data",
        "/relative",
    ):
        with pytest.raises(EgressRefused):
            check_url(URL(bad), none)
    check_url(URL("http://127.0.0.1:9/x"), Allowlist.parse("127.0.0.1:9"))


async def test_signed_call_and_its_answer(receiver: Receiver) -> None:
    runner = _runner(receiver.url.removeprefix("http://"))
    try:
        run = await runner.run("acme", _tool(f"{receiver.url}/ok"), "call_1", '{"id": 7}', 5.0)
        assert run.status == "ok", run
        assert json.loads(run.content) == {"status": "shipped", "echo": {"id": 7}, "signed": True}
        assert receiver.calls[0].body == {
            "tool": "lookup",
            "call_id": "call_1",
            "arguments": {"id": 7},
        }
        again = await runner.run("acme", _tool(f"{receiver.url}/ok"), "call_2", "{}", 5.0)
        assert again.status == "ok" and receiver.calls[1].cookies == {}  # no cookie jar
    finally:
        await runner.egress.close()


async def test_failures_are_answers(receiver: Receiver) -> None:
    runner = _runner(receiver.url.removeprefix("http://"), failures=100, timeout_s=0.5)
    try:
        cases = {
            "/slow": "tool_timeout",
            "/fail": "tool_error",
            "/huge": "tool_result_too_large",
            "/text": "tool_result_not_json",
            "/redirect": "tool_error",
        }
        for path, status in cases.items():
            run = await runner.run("acme", _tool(receiver.url + path), "c", "{}", 5.0)
            assert run.status == status, (path, run)
            assert json.loads(run.content)["error"] == status
        assert receiver.paths() == list(cases)  # the redirect was not followed to /ok
        bad = await runner.run("acme", _tool(f"{receiver.url}/ok"), "c", "{not json", 5.0)
        assert bad.status == "invalid_arguments"
        assert (
            json.loads(
                (await runner.run("acme", _tool(receiver.url + "/fail"), "c", "{}", 5.0)).content
            )["status"]
            == 500
        )
    finally:
        await runner.egress.close()


async def test_loopback_is_refused_without_the_allowlist(receiver: Receiver) -> None:
    port = URL(receiver.url).port
    runner = _runner("")
    try:
        for url in (f"{receiver.url}/ok", f"http://localhost:{port}/ok"):
            run = await runner.run("acme", _tool(url), "c", "{}", 5.0)
            assert run.status == "tool_endpoint_refused", run
        # https to a name that resolves to 127.0.0.1: refused by the resolver at connect time
        run = await runner.run("acme", _tool(f"https://localhost:{port}/ok"), "c", "{}", 5.0)
        assert run.status == "tool_endpoint_refused" and "non-public" in run.content, run
        assert receiver.calls == []
    finally:
        await runner.egress.close()


async def test_an_allowlisted_name_still_resolves_per_connection(receiver: Receiver) -> None:
    port = URL(receiver.url).port
    runner = _runner(f"localhost:{port}")
    try:
        for i in range(3):
            run = await runner.run("acme", _tool(f"http://localhost:{port}/ok"), f"c{i}", "{}", 5.0)
            assert run.status == "ok", run
    finally:
        await runner.egress.close()


async def test_the_circuit_opens_per_tenant_endpoint(receiver: Receiver) -> None:
    runner = _runner(receiver.url.removeprefix("http://"), failures=2)
    try:
        statuses = [
            (await runner.run("acme", _tool(receiver.url + "/fail"), "c", "{}", 5.0)).status
            for _ in range(4)
        ]
        assert statuses == ["tool_error", "tool_error", "tool_unavailable", "tool_unavailable"]
        assert receiver.paths() == ["/fail", "/fail"]
        ok = await runner.run("acme", _tool(receiver.url + "/ok"), "c", "{}", 5.0)
        assert ok.status == "ok"  # another endpoint of the tenant is unaffected
        other = await runner.run("beta", _tool(receiver.url + "/fail"), "c", "{}", 5.0)
        assert other.status == "tool_unavailable" and "signing secret" in other.content
    finally:
        await runner.egress.close()


def test_breaker_half_open_trial() -> None:
    now = [0.0]
    b = Breakers(2, 10.0, clock=lambda: now[0])
    for _ in range(2):
        assert b.admit("k")
        b.record("k", ok=False)
        b.check_integrity()
    assert not b.admit("k")
    now[0] = 10.0
    assert b.admit("k") and not b.admit("k")  # one trial
    b.record("k", ok=False)
    assert not b.admit("k")
    now[0] = 20.0
    assert b.admit("k")
    b.release("k")  # the trial ended without a verdict (nothing sent, or cancelled) ...
    b.check_integrity()
    assert b.is_open("k") and b.admit("k")  # ... so the next call is the trial
    b.record("k", ok=True)
    b.check_integrity()
    assert b.admit("k") and not b.is_open("k")
    b.release("k")  # a closed circuit: nothing to release
    b.check_integrity()
