"""One IPv6 network is one visitor, for every rule that counts visitors: the per-visitor rate
limit, the prefix-cache scope and the ledger's end user (gateway/access/visitor.py).

The gateway sees the client through a trusted proxy on loopback (KVGATE_TRUSTED_PROXIES) that
forwards the client's address in X-Forwarded-For, as a load balancer in front of it would: the
test cannot open connections from several IPv6 addresses of one /64, a proxy's header is how
such addresses reach a gateway in production as well.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from multidict import CIMultiDict

from tests.gateway.harness import LiveGateway, live_gateway, make_settings
from tests.widget.helpers import CONVERSATION, chat_body, pinned_tokens, widget_tenant

SITE = "https://shop.example"
HOME = "2001:db8:1:2::1"  # one household's /64 ...
PHONE = "2001:db8:1:2:8d3c:51ff:fe2a:7b10"  # ... another device of it (a privacy address)
LAPTOP = "2001:db8:1:2::3"
NEIGHBOUR = "2001:db8:1:3::1"  # the next /64: someone else


async def send(
    gw: LiveGateway, widget_key: str, *forwarded: str
) -> tuple[int, CIMultiDict[str], Any]:
    """A widget chat through the proxy; ``forwarded``: its X-Forwarded-For headers, in order."""
    headers = CIMultiDict({"Authorization": f"Bearer {widget_key}", "Origin": SITE})
    for hop in forwarded:
        headers.add("X-Forwarded-For", hop)
    url = f"{gw.base_url}/v1/chat/completions"
    async with gw.http.post(url, json=chat_body(gw, *CONVERSATION), headers=headers) as resp:
        return resp.status, CIMultiDict(resp.headers), await resp.json()


def cached(answer: dict[str, Any]) -> int:
    return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])


async def end_users(gw: LiveGateway, tenant_id: str, request_ids: list[str]) -> list[str]:
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    stamp = "%Y-%m-%dT%H:00:00Z"
    window = {"start": (hour - timedelta(hours=1)).strftime(stamp)}
    window["end"] = (hour + timedelta(hours=2)).strftime(stamp)
    async with asyncio.timeout(30):
        while True:
            page = await gw.admin("GET", f"/tenants/{tenant_id}/usage/records?{urlencode(window)}")
            found = {r["request_id"]: r["end_user"] for r in page["data"]}
            if all(rid in found for rid in request_ids):
                return [found[rid] for rid in request_ids]
            await asyncio.sleep(0.1)


async def test_addresses_of_one_ipv6_network_are_one_visitor(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(
        gateway_database, tmp_path, KVGATE_TRUSTED_PROXIES="127.0.0.1", KVGATE_VISITOR_RPM="2"
    )
    async with live_gateway(settings, demo_model_dir) as gw:
        t = await widget_tenant(gw, "v6", [SITE], limits={"rpm": 1000})
        prefix = await pinned_tokens(gw, t.id)

        status, _, home = await send(gw, t.widget_key, HOME)
        assert status == 200 and cached(home) == prefix, home
        # Another address of the household: its conversation is the household's (the cache
        # scope is the /64's) and it spends the same per-visitor budget.
        status, _, phone = await send(gw, t.widget_key, PHONE)
        assert status == 200 and cached(phone) > prefix, phone
        status, headers, refused = await send(gw, t.widget_key, LAPTOP)
        assert status == 429 and headers["x-ratelimit-scope"] == "visitor", refused
        # A client's own X-Forwarded-For header beside the proxy's does not make it someone
        # else: the proxy's (last) hop counts, however the hops are split over headers.
        status, headers, _ = await send(gw, t.widget_key, "198.51.100.7", LAPTOP)
        assert status == 429 and headers["x-ratelimit-scope"] == "visitor"
        # The next /64 is another visitor: a budget and a cache scope of its own.
        status, _, neighbour = await send(gw, t.widget_key, NEIGHBOUR)
        assert status == 200 and cached(neighbour) <= prefix, neighbour

        ids = [home["id"], phone["id"], neighbour["id"]]
        home_user, phone_user, neighbour_user = await end_users(gw, t.id, ids)
        assert home_user == phone_user != neighbour_user
        assert home_user.startswith("visitor:") and HOME not in home_user


async def test_the_prefix_is_a_setting(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    """KVGATE_VISITOR_IPV6_PREFIX=128 counts each IPv6 address alone; 48 a whole site."""
    for prefix, expected in (("128", 200), ("48", 429)):
        settings = make_settings(
            gateway_database,
            tmp_path / prefix,
            KVGATE_TRUSTED_PROXIES="127.0.0.1",
            KVGATE_VISITOR_RPM="1",
            KVGATE_VISITOR_IPV6_PREFIX=prefix,
        )
        async with live_gateway(settings, demo_model_dir) as gw:
            t = await widget_tenant(gw, "v6p", [SITE], limits={"rpm": 1000})
            assert (await send(gw, t.widget_key, HOME))[0] == 200
            status, _, _ = await send(gw, t.widget_key, NEIGHBOUR)  # same /48, another /64
            assert status == expected, prefix
