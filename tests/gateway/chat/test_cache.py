"""Prefix reuse through the gateway: pinned tenant prompts, no sharing across tenants."""

from __future__ import annotations

from pathlib import Path

from gateway.chat.prompt import assemble
from gateway.chat.schemas import ChatMessage
from gateway.prompts.tenant_prefix import build_prefix
from tests.gateway.harness import live_gateway, make_settings, wait_for

SYSTEM = (
    "You are the support assistant of Example Incorporated. Always answer in two sentences. "
    "Never discuss pricing; refer such questions to the sales team. Be friendly. "
) * 3


async def test_cached_tokens_cover_the_system_prompt_and_stay_in_the_tenant(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(gateway_database, tmp_path)
    async with live_gateway(settings, demo_model_dir) as gw:
        a = await gw.create_tenant("cache-a", system_prompt=SYSTEM)
        info = await gw.wait_pinned(a.id)
        block = settings.model.block_size
        prefix_tokens = info["prefix_tokens"]
        assert info["pin_state"] == "pinned"
        assert info["pinned_tokens"] == prefix_tokens // block * block > 0
        assert info["pinned_blocks"] == prefix_tokens // block

        client = gw.openai(a.key)
        usages = []
        for question in ("What is your refund policy?", "Tell me a story about ships."):
            resp = await client.chat.completions.create(
                model=gw.state.model_name,
                messages=[{"role": "user", "content": question}],
                max_tokens=3,
            )
            usages.append(resp.usage)
        for usage in usages:
            cached = usage.prompt_tokens_details.cached_tokens
            assert cached >= prefix_tokens // block * block
            assert cached % block == 0 and cached < usage.prompt_tokens

        # Same prompt text, other tenant: its own namespace, its own pin.
        b = await gw.create_tenant("cache-b", system_prompt=SYSTEM)
        b_info = await gw.wait_pinned(b.id)
        assert b_info["prefix_tokens"] == prefix_tokens
        stats_before = gw.state.engine.cache_stats()
        resp = await gw.openai(b.key).chat.completions.create(
            model=gw.state.model_name,
            messages=[{"role": "user", "content": "What is your refund policy?"}],
            max_tokens=3,
        )
        # B's hits come only from B's own pinned prefix, which B computed itself.
        assert resp.usage.prompt_tokens_details.cached_tokens == b_info["pinned_tokens"]
        assert gw.state.engine.cache_stats().blocks_pinned == stats_before.blocks_pinned

        tenant_a = await gw.admin("GET", f"/tenants/{a.id}/cache")
        assert tenant_a["requests"] == 2 and tenant_a["hit_tokens"] >= 2 * info["pinned_tokens"]
        assert tenant_a["query_tokens"] == sum(u.prompt_tokens for u in usages)
        gw.state.pins.check_integrity()


async def test_identical_tokens_in_another_tenant_get_no_hits(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(gateway_database, tmp_path)
    async with live_gateway(settings, demo_model_dir) as gw:
        a = await gw.create_tenant("iso-a", system_prompt=SYSTEM)
        b = await gw.create_tenant("iso-b")  # no tenant prompt: B's namespace stays cold
        await gw.wait_pinned(a.id)
        question = {"role": "user", "content": "What is your refund policy?"}
        # B sends A's system prompt itself: token for token the same prompt as A's requests.
        tok = gw.state.tokenizer
        a_ids = assemble(tok, build_prefix(tok, SYSTEM), [ChatMessage(**question)])
        b_msgs = [ChatMessage(role="system", content=SYSTEM), ChatMessage(**question)]
        assert assemble(tok, build_prefix(tok, None), b_msgs) == a_ids

        kw = {"model": gw.state.model_name, "max_tokens": 2}
        ra = await gw.openai(a.key).chat.completions.create(messages=[question], **kw)
        b_body = [{"role": "system", "content": SYSTEM}, question]
        rb = await gw.openai(b.key).chat.completions.create(messages=b_body, **kw)
        assert ra.usage.prompt_tokens == rb.usage.prompt_tokens == len(a_ids)
        assert ra.usage.prompt_tokens_details.cached_tokens > 0
        assert rb.usage.prompt_tokens_details.cached_tokens == 0  # never A's blocks
        rb2 = await gw.openai(b.key).chat.completions.create(messages=b_body, **kw)
        assert rb2.usage.prompt_tokens_details.cached_tokens > 0  # but B reuses its own


async def test_stop_strings_end_the_answer(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(gateway_database, tmp_path)
    async with live_gateway(settings, demo_model_dir) as gw:
        t = await gw.create_tenant("stops")
        client = gw.openai(t.key)
        kw = {
            "model": gw.state.model_name,
            "messages": [{"role": "user", "content": "count"}],
            "temperature": 0,
            "seed": 1,
        }
        full = (await client.chat.completions.create(max_tokens=12, **kw)).choices[0]
        text = full.message.content
        assert len(text) >= 4, text
        stop = text[2:4]
        cut = (await client.chat.completions.create(max_tokens=12, stop=[stop], **kw)).choices[0]
        assert cut.message.content == text[: text.index(stop)]
        assert cut.finish_reason == "stop"
        stream = await client.chat.completions.create(max_tokens=12, stop=stop, stream=True, **kw)
        chunks = [c async for c in stream]
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == cut.message.content
        assert chunks[-1].choices[0].finish_reason == "stop"
        # Nothing is left running once the stop string ended the request.
        await wait_for(lambda: gw.state.engine.cache_stats().blocks_in_use == 0)
