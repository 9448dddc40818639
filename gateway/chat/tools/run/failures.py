"""A tool call that did not give an answer the model can use: its code and details become the
``tool`` message (gateway/chat/tools/run/runner.py lists the codes), and what it says of the
endpoint's health is what the circuit breakers count (gateway/chat/tools/run/breaker.py)."""

from __future__ import annotations

import enum
import json
from typing import Any


class Endpoint(enum.Enum):
    """What a failed call says of the endpoint that serves the tool.

    ``DOWN`` is the only verdict a breaker counts: a visitor choosing the arguments can make a
    tool refuse its call (``ANSWERED``) as often as it likes, and must not be able to switch
    the tool off for everyone else by it."""

    NOT_REACHED = "not_reached"  # nothing was sent: egress rules, no signing secret, no server
    ANSWERED = "answered"  # it answered: a 4xx, an MCP error result or JSON-RPC error, an answer
    # the gateway cannot use (not JSON, too large): the endpoint works, the call was refused
    DOWN = "down"  # no connection, a broken one, no answer in time, a 5xx


class ToolFailure(Exception):
    def __init__(self, code: str, *, endpoint: Endpoint = Endpoint.NOT_REACHED, **details: Any):
        super().__init__(code)
        self.code = code
        self.endpoint = endpoint
        self.details = details

    def content(self) -> str:
        return json.dumps({"error": self.code, **self.details})
