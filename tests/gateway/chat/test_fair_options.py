"""A chat request reaches the engine with its tenant, the tenant's weight and the key's class."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from pathlib import Path
from typing import Any

from engine.api import GenerateOptions
from engine.outputs import RequestOutput
from engine.params import SamplingParams
from tests.gateway.harness import live_gateway, make_settings


async def test_weight_and_priority_travel_with_each_request(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(gateway_database, tmp_path)
    async with live_gateway(settings, demo_model_dir) as gw:
        tenant = await gw.create_tenant("acme", limits={"rpm": 100})
        await gw.admin("PUT", f"/tenants/{tenant.id}/limits", {"weight": 2.5})
        batch = await gw.admin(
            "POST", f"/tenants/{tenant.id}/keys", {"kind": "server", "priority": "batch"}
        )
        engine = gw.state.engine
        seen: list[GenerateOptions] = []
        real = engine.generate

        def spy(
            ids: Sequence[int], params: SamplingParams, options: GenerateOptions, **kw: Any
        ) -> AsyncGenerator[RequestOutput, None]:
            seen.append(options)  # the real engine serves it
            return real(ids, params, options, **kw)

        engine.generate = spy
        for key in (tenant.key, batch["key"]):
            resp = await gw.openai(key).chat.completions.create(
                model=gw.state.model_name,
                messages=[{"role": "user", "content": "hello"}],
                max_tokens=2,
            )
            assert resp.choices[0].finish_reason in ("stop", "length")
        got = [(o.tenant, o.weight, o.priority) for o in seen]
        assert got == [(tenant.id, 2.5, "interactive"), (tenant.id, 2.5, "batch")]
