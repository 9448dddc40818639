"""Helpers of the widget tests: tenants with widget keys, sessions, raw HTTP against a gateway."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from multidict import CIMultiDict

from tests.gateway.harness import LiveGateway, TenantHandle

PROMPT = (
    "You are the helpful assistant of a small shop. Answer questions about orders, shipping, "
    "returns and opening hours politely and briefly."
)

# Several KV blocks past the tenant prompt: a conversation worth probing the cache scope for.
CONVERSATION = (
    ("user", "My order 4411 to 12 Harbour Lane never arrived, and I was charged twice for it."),
    ("assistant", "I am sorry to hear that. I have opened a refund request for the double charge."),
    ("user", "Thank you. Can you also send the replacement to my office at 9 Mill Street?"),
)


@dataclass(frozen=True)
class WidgetTenant:
    id: str
    server_key: str
    widget_key: str


async def widget_tenant(
    gw: LiveGateway, prefix: str, origins: list[str], **tenant: Any
) -> WidgetTenant:
    t: TenantHandle = await gw.create_tenant(prefix, system_prompt=PROMPT, **tenant)
    body = {"kind": "widget", "allowed_origins": origins}
    key = await gw.admin("POST", f"/tenants/{t.id}/keys", body)
    return WidgetTenant(t.id, t.key, key["key"])


async def request(
    gw: LiveGateway, method: str, path: str, *, json: Any = None, **headers: str
) -> tuple[int, CIMultiDict[str], Any]:
    """(status, headers, JSON body or text) of one request to the gateway."""
    async with gw.http.request(method, gw.base_url + path, json=json, headers=headers) as resp:
        if resp.content_type == "application/json":
            body: Any = await resp.json()
        else:
            body = await resp.text()
        return resp.status, CIMultiDict(resp.headers), body


def chat_body(gw: LiveGateway, *messages: tuple[str, str], **extra: Any) -> dict[str, Any]:
    return {
        "model": gw.state.model_name,
        "messages": [{"role": r, "content": c} for r, c in messages],
        "max_tokens": 2,
        **extra,
    }


async def widget_chat(
    gw: LiveGateway, credential: str, origin: str, body: dict[str, Any] | None = None
) -> tuple[int, CIMultiDict[str], Any]:
    """One chat completion as the widget sends it: a bearer key or session token, an Origin."""
    return await request(
        gw,
        "POST",
        "/v1/chat/completions",
        json=chat_body(gw, ("user", "hi")) if body is None else body,
        Authorization=f"Bearer {credential}",
        Origin=origin,
    )


async def new_session(
    gw: LiveGateway, server_key: str, origin: str, user: str = "user-1", ttl_s: int = 600
) -> tuple[int, Any]:
    status, _, body = await request(
        gw,
        "POST",
        "/v1/widget/sessions",
        json={"end_user_id": user, "origin": origin, "ttl_s": ttl_s},
        Authorization=f"Bearer {server_key}",
    )
    return status, body


async def pinned_tokens(gw: LiveGateway, tenant_id: str) -> int:
    info = await gw.wait_pinned(tenant_id)
    assert info["pin_state"] == "pinned" and info["pinned_tokens"] > 0
    return int(info["pinned_tokens"])  # the tenant prefix rounded down to blocks
