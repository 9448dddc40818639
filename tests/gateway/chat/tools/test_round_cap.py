"""The gateway's tool loop runs at most KVGATE_TOOL_MAX_CALLS_PER_ROUND calls a round."""

from __future__ import annotations

import json

from gateway.chat.tools.loop import capped
from gateway.chat.tools.parser import ToolCall


def test_a_round_runs_at_most_its_cap_of_calls() -> None:
    """KVGATE_TOOL_MAX_CALLS_PER_ROUND: the first calls run, the rest are answered
    ``tool_call_limit`` without running, so the model reads why."""
    calls = [ToolCall(f"call_{i}", "lookup_order", '{"order_id": 1}', True) for i in range(5)]
    run, over = capped(calls, 2)
    assert run == calls[:2]
    assert [(r.call_id, r.name, r.status) for r in over] == [
        (f"call_{i}", "lookup_order", "tool_call_limit") for i in (2, 3, 4)
    ]
    assert all(json.loads(r.content)["error"] == "tool_call_limit" for r in over)
    assert capped(calls, 8) == (calls, [])
