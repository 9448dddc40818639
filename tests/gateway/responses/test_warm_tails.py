"""Warm tails (item 3): a stored conversation's next turn hits the KV cache for every token of
the turns before it, through ``previous_response_id`` and ``conversation``, in the end user's
cache scope; after the device pool is cycled, the tail comes back from the host tier.

The bound: turn k+1's ``cached_tokens`` >= the tokens of turns 1..k rounded down to whole
blocks, less the last generated token (sampled, never fed back, so its K/V is computed with
turn k+1's new input)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.gateway.harness import live_gateway, make_settings

SYSTEM = "You are the concierge of the Grand Hotel. Keep answers short and polite. " * 4
QUESTIONS = [
    "Good morning, is breakfast still served?",
    "And where is the pool?",
    "Can I book a taxi for noon?",
    "Thanks, what is the wifi password?",
]


def floor_blocks(tokens: int, block: int) -> int:
    return tokens // block * block


def carried(r: Any) -> int:
    """Tokens of the conversation through this turn that the next turn can find cached."""
    return r.usage.input_tokens + r.usage.output_tokens - 1


async def test_previous_response_id_keeps_the_tail_warm(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(gateway_database, tmp_path)
    block = settings.model.block_size
    async with live_gateway(settings, demo_model_dir) as gw:
        t = await gw.create_tenant("tails", system_prompt=SYSTEM)
        await gw.wait_pinned(t.id)
        client = gw.openai(t.key)
        model = gw.state.model_name
        last: Any = None
        for question in QUESTIONS:
            previous = last.id if last is not None else None
            r = await client.responses.create(
                model=model, input=question, previous_response_id=previous, max_output_tokens=16
            )
            if last is not None:
                cached = r.usage.input_tokens_details.cached_tokens
                assert cached >= floor_blocks(carried(last), block), (cached, last.usage)
                # only the new input (and what follows the last answer) is computed
                assert r.usage.input_tokens - cached < len(question) + 2 * block
            last = r


async def test_conversation_keeps_the_tail_warm(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(gateway_database, tmp_path)
    block = settings.model.block_size
    async with live_gateway(settings, demo_model_dir) as gw:
        t = await gw.create_tenant("conv-tails", system_prompt=SYSTEM)
        await gw.wait_pinned(t.id)
        client = gw.openai(t.key)
        conv = await client.conversations.create(metadata={"topic": "stay"})
        last = None
        for question in QUESTIONS[:3]:
            r = await client.responses.create(
                model=gw.state.model_name,
                input=question,
                conversation=conv.id,
                max_output_tokens=16,
            )
            if last is not None:
                cached = r.usage.input_tokens_details.cached_tokens
                assert cached >= floor_blocks(carried(last), block), (cached, last.usage)
            last = r
        items = await client.conversations.items.list(conv.id, order="asc")
        assert [i.type for i in items.data] == ["message"] * 6
        assert [i.role for i in items.data] == ["user", "assistant"] * 3


async def test_tail_comes_back_from_the_host_tier(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    # A small device pool and a host tier four times its size: other traffic evicts the
    # conversation's blocks from the device (offloaded), the next turn restores them.
    settings = make_settings(
        gateway_database,
        tmp_path,
        KVGATE_KV_CACHE_BYTES=str(2 << 20),
        KVGATE_HOST_KV_BYTES=str(8 << 20),
    )
    block = settings.model.block_size
    async with live_gateway(settings, demo_model_dir) as gw:
        t = await gw.create_tenant("host-tails", system_prompt=SYSTEM)
        other = await gw.create_tenant("flood")
        await gw.wait_pinned(t.id)
        client, model = gw.openai(t.key), gw.state.model_name
        first = await client.responses.create(model=model, input=QUESTIONS[0], max_output_tokens=16)
        engine = gw.state.engine
        total = engine.cache_stats().blocks_total
        flood = gw.openai(other.key)
        for i in range(total // 4 + 2):  # more distinct blocks than the device pool holds
            # kept longer than the conversation's blocks ("24h"): the cycle evicts those
            text = " ".join(f"w{i}x{j}" for j in range(40))
            await flood.responses.create(
                model=model,
                input=text,
                max_output_tokens=16,
                store=False,
                prompt_cache_retention="24h",
            )
        before = engine.cache_stats()
        assert before.evictions > 0 and before.blocks_offloaded > 0
        r = await client.responses.create(
            model=model, input=QUESTIONS[1], previous_response_id=first.id, max_output_tokens=16
        )
        after = engine.cache_stats()
        cached = r.usage.input_tokens_details.cached_tokens
        assert cached >= floor_blocks(carried(first), block)
        assert after.blocks_restored > before.blocks_restored
        assert after.host_hit_tokens > before.host_hit_tokens


async def test_prompt_cache_key_narrows_the_scope(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    """Turns under another ``prompt_cache_key`` (same owner) never share blocks past the tenant
    prefix; the same key keeps the tail warm."""
    settings = make_settings(gateway_database, tmp_path)
    block = settings.model.block_size
    async with live_gateway(settings, demo_model_dir) as gw:
        t = await gw.create_tenant("cache-key", system_prompt=SYSTEM)
        info = await gw.wait_pinned(t.id)
        client, model = gw.openai(t.key), gw.state.model_name
        kw: dict[str, Any] = {"model": model, "max_output_tokens": 16}
        first = await client.responses.create(input=QUESTIONS[0], prompt_cache_key="a", **kw)
        other = await client.responses.create(
            input=QUESTIONS[1], previous_response_id=first.id, prompt_cache_key="b", **kw
        )
        assert other.usage.input_tokens_details.cached_tokens == info["pinned_tokens"]
        same = await client.responses.create(
            input=QUESTIONS[1], previous_response_id=first.id, prompt_cache_key="a", **kw
        )
        cached = same.usage.input_tokens_details.cached_tokens
        assert cached >= floor_blocks(carried(first), block)
