"""The MCP transport's egress rules: names resolving to loopback refused unless allowlisted,
requests kept on the server's own host, connections sent to the address that was checked."""

from __future__ import annotations

import httpx2
import pytest

from gateway.chat.tools.run.egress import Allowlist, EgressRefused
from gateway.chat.tools.run.mcp_http import PinnedTransport, checked_address
from tests.gateway.chat.tools.tenant.webhook_server import webhook_receiver


async def test_loopback_names_need_the_allowlist() -> None:
    with pytest.raises(EgressRefused, match="non-public"):
        await checked_address("localhost", 443, Allowlist())
    assert await checked_address("localhost", 80, Allowlist.parse("localhost:80")) in (
        "127.0.0.1",
        "::1",
    )


async def test_requests_stay_on_the_server_host_and_reach_the_checked_address() -> None:
    async with webhook_receiver() as receiver:
        port = receiver.url.rsplit(":", 1)[1]
        allow = Allowlist.parse(f"localhost:{port}")
        transport = PinnedTransport(f"http://localhost:{port}/ok", allow, 1 << 16)
        async with httpx2.AsyncClient(transport=transport) as client:
            resp = await client.post(f"http://localhost:{port}/ok", json={"arguments": {}})
            assert resp.status_code == 200 and resp.json()["status"] == "shipped"
            with pytest.raises(EgressRefused, match="server's host"):
                await client.post(f"http://127.0.0.1:{port}/ok", json={"arguments": {}})
        assert receiver.paths() == ["/ok"]
    with pytest.raises(EgressRefused):
        PinnedTransport("http://hooks.example.com/mcp", Allowlist(), 1 << 16)  # http: refused
