"""Round trips through a live gateway with the official OpenAI client."""

from __future__ import annotations

from pathlib import Path

from tests.gateway.harness import live_gateway, make_settings

SYSTEM = "You are the assistant of Acme Corp. Answer briefly and politely. " * 4


async def test_non_streaming_and_streaming_round_trip(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(gateway_database, tmp_path)
    async with live_gateway(settings, demo_model_dir) as gw:
        tenant = await gw.create_tenant("acme", system_prompt=SYSTEM)
        await gw.wait_pinned(tenant.id)
        client = gw.openai(tenant.key)
        models = await client.models.list()
        assert [m.id for m in models.data] == [gw.state.model_name]

        resp = await client.chat.completions.create(
            model=gw.state.model_name,
            messages=[{"role": "user", "content": "hello there"}],
            max_tokens=5,
            temperature=0,
        )
        choice = resp.choices[0]
        assert choice.finish_reason in ("stop", "length")
        assert resp.usage.completion_tokens <= 5
        assert resp.usage.prompt_tokens > 0
        assert isinstance(choice.message.content, str)

        stream = await client.chat.completions.create(
            model=gw.state.model_name,
            messages=[{"role": "user", "content": "hello there"}],
            max_tokens=5,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == choice.message.content  # greedy: same answer both ways
        finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
        assert len(finals) == 1 and finals[0].choices[0].finish_reason == choice.finish_reason
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == resp.usage.completion_tokens
        cached = chunks[-1].usage.prompt_tokens_details.cached_tokens
        assert cached >= 16  # the pinned system prompt at least
