"""``Turn``: what differs between the requests served through the chat path.

``POST /v1/chat/completions`` and ``POST /v1/responses`` share every step of
gateway/chat/views.py (key, admission, limits, budgets, engine, tools, ledger, clean-up); a turn
only says how its body becomes a ``ChatRequest``, whether it brings its own prompt ids (a stored
conversation's warm tail), and how the answer is written.
"""

from __future__ import annotations

from typing import Protocol

from aiohttp import web

from engine.api import GenerateOptions
from gateway.access.auth import Principal
from gateway.chat.admission import Prepared, PromptHook
from gateway.chat.generation import ChoiceGroup
from gateway.chat.observe import RequestObserver
from gateway.chat.schemas import ChatRequest
from gateway.chat.tools.loop import ToolLoop
from gateway.context import GatewayState


class Turn(Protocol):
    rid_prefix: str  # of the request id (the ledger's record id, the answer's id)

    async def read(
        self, request: web.Request, state: GatewayState, principal: Principal, rid: str
    ) -> ChatRequest:
        """The request as a chat request, checked (gateway/chat/admission.py ``check_body``)."""
        ...

    def prompt_hook(self) -> PromptHook | None:
        """The turn's own prompt ids, when it has them (else the ordinary assembly)."""
        ...

    def engine_options(
        self, request: web.Request, principal: Principal, options: GenerateOptions, shared: int
    ) -> GenerateOptions:
        """The engine options of the turn (chat's: ``options``, its end user's cache scope);
        ``shared``: the prompt's tokens of the tenant prefix."""
        ...

    async def answer(
        self,
        request: web.Request,
        gen: ChoiceGroup,
        ready: Prepared,
        headers: dict[str, str],
        obs: RequestObserver,
    ) -> web.StreamResponse:
        """Write the answer of a running generation (JSON or a stream)."""
        ...

    async def answer_loop(
        self,
        request: web.Request,
        loop: ToolLoop,
        gen: ChoiceGroup,
        headers: dict[str, str],
        obs: RequestObserver,
    ) -> web.StreamResponse:
        """Write the answer of a turn whose tools the gateway runs."""
        ...
