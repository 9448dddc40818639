"""A tenant's webhook tools through ``POST /v1/responses``: the gateway runs them as it does
for chat (tests/gateway/chat/tools/tenant/test_tool_loop.py, whose receiver and gateway this
module shares) and the turn's answer is the text after the loop, stored, with the steps'
usage summed; streamed, the same answer arrives as the event stream."""

from __future__ import annotations

import pytest

from tests.gateway.chat.tools.tenant.test_tool_loop import _tenant, gw, hook, named, receiver
from tests.gateway.chat.tools.tenant.webhook_server import Receiver
from tests.gateway.harness import LiveGateway

__all__ = ["gw", "receiver"]

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_tenant_tools_run_in_a_response_turn(gw: LiveGateway, receiver: Receiver) -> None:
    tools = [hook("lookup_order", f"{receiver.url}/ok")]
    client = await _tenant(
        gw, receiver, tools=tools, tool_choice=named("lookup_order"), max_tool_rounds=1
    )
    before = len(receiver.calls)
    kw = {"model": gw.state.model_name, "max_output_tokens": 60, "temperature": 0.0}
    r = await client.responses.create(input="Where is order 12?", **kw)
    assert len(receiver.calls) == before + 1  # the gateway ran the tool once
    assert [o.type for o in r.output] == ["message"]  # the answer after the loop
    assert r.usage.input_tokens_details.cached_tokens > 0  # the second step reused the first
    stored = await client.responses.retrieve(r.id)
    assert stored.output_text == r.output_text
    kinds = []
    async with client.responses.stream(input="Where is order 7?", **kw) as stream:
        async for event in stream:
            kinds.append(event.type)
    assert len(receiver.calls) == before + 2
    assert kinds[0] == "response.created" and "response.output_text.done" in kinds
    assert kinds[-1] in ("response.completed", "response.incomplete")
