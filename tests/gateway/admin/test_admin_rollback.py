"""Prompt rollback on a live gateway: the target version is pinned before traffic switches, and
the version it replaces is unpinned once its in-flight request ends."""

from __future__ import annotations

from pathlib import Path

from tests.gateway.harness import live_gateway, make_settings, wait_for

PROMPT = "{n}: company handbook section; always be accurate, cite the policy, stay polite. " * 4


async def test_rollback_pins_target_then_releases_old_after_in_flight(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    async with live_gateway(make_settings(gateway_database, tmp_path), demo_model_dir) as gw:
        t = await gw.create_tenant(
            "roll", system_prompt=PROMPT.format(n=1), limits={"max_output_tokens": 300}
        )
        await gw.admin("PUT", f"/tenants/{t.id}/system-prompt", {"text": PROMPT.format(n=2)})
        await wait_for(lambda: gw.state.pins.cache_info(t.id)["prompt_version"] == 2)
        v2 = await gw.wait_pinned(t.id)
        await wait_for(lambda: not gw.state.pins.cache_info(t.id)["retiring_versions"])
        pins, engine = gw.state.pins, gw.state.engine
        client = gw.openai(t.key)
        msgs = [{"role": "user", "content": "go"}]
        stream = await client.chat.completions.create(
            model=gw.state.model_name, messages=msgs, max_tokens=300, stream=True
        )
        assert (await anext(aiter(stream))).choices
        pinned_before = engine.cache_stats().blocks_pinned

        out = await gw.admin("POST", f"/tenants/{t.id}/system-prompts/1/activate")
        assert out == {"version": 1, "previous_version": 2, "changed": True}
        # The activation's event has run: version 1 is pinned and current, 2 still serves.
        info = await gw.admin("GET", f"/tenants/{t.id}/cache")
        assert info["prompt_version"] == 1 and info["pin_state"] == "pinned"
        assert info["retiring_versions"] == [2]
        both = pinned_before + info["pinned_blocks"]
        await wait_for(lambda: engine.cache_stats().blocks_pinned == both)
        pins.check_integrity()

        async for _ in stream:
            pass
        await wait_for(lambda: not gw.state.pins.cache_info(t.id)["retiring_versions"])
        after = both - v2["pinned_blocks"]
        await wait_for(lambda: engine.cache_stats().blocks_pinned == after)
        resp = await client.chat.completions.create(
            model=gw.state.model_name, messages=msgs, max_tokens=2
        )
        assert resp.usage.prompt_tokens_details.cached_tokens >= info["pinned_tokens"]
        pins.check_integrity()
        audit = await gw.admin("GET", f"/audit?tenant={t.id}")
        assert audit["data"][0]["action"] == "prompt.activate"
