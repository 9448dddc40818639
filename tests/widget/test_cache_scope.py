"""Visitors of one tenant share its pinned prompt in the prefix cache, never each other's turns.

A visitor who could hit another visitor's blocks would learn, from ``cached_tokens`` (or time to
first token), whether a guessed conversation had been sent: every test here sends one visitor's
exact conversation as another and checks that it hits the tenant prefix and nothing more.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.context import SETTINGS
from tests.gateway.harness import LiveGateway, live_gateway, make_settings
from tests.widget.helpers import (
    CONVERSATION,
    chat_body,
    new_session,
    pinned_tokens,
    request,
    widget_tenant,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

SITE = "https://shop.example"


async def cached(gw: LiveGateway, auth: dict[str, str], **extra: Any) -> tuple[int, int]:
    """(prompt tokens, cached tokens) of the conversation sent with ``auth``."""
    body = chat_body(gw, *CONVERSATION, **extra)
    status, _, answer = await request(gw, "POST", "/v1/chat/completions", json=body, **auth)
    assert status == 200, answer
    usage = answer["usage"]
    return usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]


async def test_session_visitors_hit_the_tenant_prefix_and_only_their_own_conversation(
    gw: LiveGateway,
) -> None:
    t = await widget_tenant(gw, "scope", [SITE])
    prefix = await pinned_tokens(gw, t.id)
    block = gw.app[SETTINGS].model.block_size
    sessions = {}
    for user in ("visitor-a", "visitor-b", "visitor-c"):
        status, session = await new_session(gw, t.server_key, SITE, user=user)
        assert status == 201, session
        sessions[user] = {"Authorization": f"Bearer {session['token']}", "Origin": SITE}
    n_prompt, first = await cached(gw, sessions["visitor-a"])
    assert first == prefix and n_prompt - prefix > 3 * block  # A's own blocks follow the prefix
    # B sends A's exact conversation: the shared prefix and nothing of A's
    _, probe = await cached(gw, sessions["visitor-b"])
    assert probe <= prefix
    # ... nor C naming A as `user` (a browser sets it: ignored for widget traffic)
    _, claimed = await cached(gw, sessions["visitor-c"], user="visitor-a")
    assert claimed <= prefix
    # A resending its own conversation still hits its own blocks past the prefix
    _, again = await cached(gw, sessions["visitor-a"])
    assert again >= (n_prompt - 1) // block * block > prefix


async def test_server_keys_are_scoped_by_user_else_by_key(gw: LiveGateway) -> None:
    t = await widget_tenant(gw, "scope-srv", [SITE])
    prefix = await pinned_tokens(gw, t.id)
    server = {"Authorization": f"Bearer {t.server_key}"}
    n_prompt, first = await cached(gw, server, user="alice")
    assert first == prefix
    _, other_user = await cached(gw, server, user="bob")
    _, no_user = await cached(gw, server)
    assert other_user <= prefix and no_user <= prefix
    _, alice_again = await cached(gw, server, user="alice")
    _, no_user_again = await cached(gw, server)  # no `user`: the key's own scope
    assert alice_again > prefix and no_user_again > prefix
    # another key of the same tenant does not share the first key's scope
    key = await gw.admin("POST", f"/tenants/{t.id}/keys", {"kind": "server"})
    _, other_key = await cached(gw, {"Authorization": f"Bearer {key['key']}"})
    assert other_key <= prefix
    # the tenant's backend and its widget sessions name end users alike: one scope per user
    status, session = await new_session(gw, t.server_key, SITE, user="alice")
    assert status == 201
    widget = {"Authorization": f"Bearer {session['token']}", "Origin": SITE}
    _, alice_widget = await cached(gw, widget)
    assert alice_widget == alice_again and n_prompt > alice_widget


async def test_anonymous_widget_visitors_are_kept_apart_by_address(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    """Widget key without a session: the visitor is the client address (behind a trusted
    proxy, the X-Forwarded-For hop), as for the per-visitor limits."""
    settings = make_settings(gateway_database, tmp_path, KVGATE_TRUSTED_PROXIES="127.0.0.1/32")
    async with live_gateway(settings, demo_model_dir) as gw:
        t = await widget_tenant(gw, "scope-anon", [SITE])
        prefix = await pinned_tokens(gw, t.id)
        block = settings.model.block_size

        def visitor(address: str) -> dict[str, str]:
            return {
                "Authorization": f"Bearer {t.widget_key}",
                "Origin": SITE,
                "X-Forwarded-For": address,
            }

        n_prompt, first = await cached(gw, visitor("198.51.100.7"))
        assert first == prefix
        _, probe = await cached(gw, visitor("203.0.113.9"))
        assert probe <= prefix
        _, again = await cached(gw, visitor("198.51.100.7"))
        assert again >= (n_prompt - 1) // block * block > prefix
