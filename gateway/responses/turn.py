"""``POST /v1/responses`` as a ``Turn`` of the chat path (gateway/chat/turn.py).

read     body -> owner scope -> stored history (404 for another owner's ids) -> input
         items -> instructions under the tenant's client-system policy -> one chat request
         (instructions, history, new input), checked as chat checks its body
prompt   the stored tail and the new turns' tokens (gateway/responses/tail.py), else chat's
         assembly
engine   the conversation's cache scope and retention priority (gateway/responses/owner.py)
answer   output items -> stored with the tail (when ``store``) -> JSON or the event stream
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from aiohttp import web

from engine.api import GenerateOptions
from engine.text.tokenizer import Tokenizer
from gateway.access.auth import Principal
from gateway.chat.admission import Prepared, PromptHook, body_bytes, check_body
from gateway.chat.generation import ChoiceGroup
from gateway.chat.ledger import TOOL_CALLS
from gateway.chat.observe import RequestObserver
from gateway.chat.schemas import ChatRequest
from gateway.chat.sse import open_stream
from gateway.chat.tools.answer import complete
from gateway.chat.tools.formats import ToolFormat
from gateway.chat.tools.loop import ToolLoop
from gateway.chat.tools.models import ToolDef
from gateway.chat.tools.plan import OutputPlan
from gateway.context import STATE, GatewayState
from gateway.errors import ApiError, to_api_error
from gateway.prompts.tenant_prefix import TenantPrefix
from gateway.responses.build import chat_request, check_instructions
from gateway.responses.events import EventStream
from gateway.responses.history import History, load_history, resolve_references
from gateway.responses.items import parse_input, to_messages
from gateway.responses.live import LiveOutput
from gateway.responses.objects import response_body
from gateway.responses.output import Answer, item_bodies, output_items, usage_of
from gateway.responses.owner import conversation_options, owner_scope
from gateway.responses.request import ResponsesRequest, parse_responses_request
from gateway.responses.tail import TailPlan, digest, tail_of
from tenants.conversation_records import NewItem, NewResponse, OwnerScope
from tenants.conversation_store import ConversationStore
from tenants.models import utcnow


@contextlib.asynccontextmanager
async def _failures_as_events(events: EventStream, obs: RequestObserver) -> AsyncIterator[None]:
    """Headers are out: a failure (the store unavailable, the engine gone) becomes an ``error``
    event and the stream ends; a client that went away is not told."""
    try:
        yield
    except ConnectionError:
        raise
    except Exception as exc:
        err = to_api_error(exc) or ApiError(500, "internal server error", type_="internal_error")
        obs.stream_error = err.code or err.type
        await events.error(err)
        obs.delivered = True
        await events.resp.write_eof()


class ResponsesTurn:
    rid_prefix = "resp_"

    def __init__(self) -> None:
        self.rid = ""
        self.created_at = int(time.time())
        self.req: ResponsesRequest | None = None
        self.chat: ChatRequest | None = None
        self.scope: OwnerScope | None = None
        self.inputs: list[NewItem] = []
        self.history = History()
        self.store = True
        self.tail_plan: TailPlan | None = None
        self.prefix: TenantPrefix | None = None  # the tenant prefix the prompt was built on
        self.tokenizer: Tokenizer | None = None

    async def read(
        self, request: web.Request, state: GatewayState, principal: Principal, rid: str
    ) -> ChatRequest:
        self.rid = rid
        req = self.req = parse_responses_request(await body_bytes(request, principal))
        policy = principal.runtime.conversations
        self.store = req.store is not False and policy.store
        self.scope = owner_scope(request, principal)
        check_instructions(req, principal)
        store = ConversationStore(state.store)
        self.inputs = await resolve_references(store, self.scope, parse_input(req.input))
        self.history = await load_history(store, self.scope, req)
        instructions = [req.instructions] if req.instructions else []
        history = to_messages(self.history.data)
        messages = to_messages([i.data for i in self.inputs])
        chat = chat_request(req, instructions, history, messages, principal, self.store)
        check_body(state, principal, chat)
        self.chat = chat
        self.tokenizer = state.tokenizer
        if self.history.tail is not None and history and history[-1].role == "assistant":
            at = len(instructions) + len(history) - 1
            self.tail_plan = TailPlan(tuple(chat.messages), at, self.history.tail)
        return chat

    def prompt_hook(self) -> PromptHook | None:
        def hook(
            tok: Tokenizer, prefix: TenantPrefix, plan: OutputPlan, rendered: Sequence[ToolDef]
        ) -> list[int] | None:
            self.prefix = prefix
            if self.tail_plan is None:
                return None
            return self.tail_plan.prompt(tok, prefix, plan, rendered, self._digest(prefix))

        return hook

    def _digest(self, prefix: TenantPrefix) -> str:
        assert self.chat is not None and self.req is not None
        return digest(prefix.ids, self.chat, self.req.instructions)

    def engine_options(
        self, request: web.Request, principal: Principal, options: GenerateOptions, shared: int
    ) -> GenerateOptions:
        assert self.req is not None
        return conversation_options(
            request,
            principal,
            options,
            shared,
            user=self.req.end_user,
            cache_key=self.req.prompt_cache_key,
            retention=self.req.prompt_cache_retention,
        )

    # -- the answer ---------------------------------------------------------------------------
    async def answer(
        self,
        request: web.Request,
        gen: ChoiceGroup,
        ready: Prepared,
        headers: dict[str, str],
        obs: RequestObserver,
    ) -> web.StreamResponse:
        assert self.req is not None
        calls = ready.plan.calls
        if self.req.stream:
            return await self._stream(request, gen, ready, headers, obs, calls)
        c = (await gen.results())[0]
        if calls is None:
            answer = Answer(c.text, (), c.finish_reason)
        else:
            done = complete(calls, c.text, c.finish_reason)
            gen.stats.finish_reason = done.finish_reason
            answer = Answer(done.content, tuple(done.tool_calls or ()), done.finish_reason)
        tail_ids = gen.choices[0].token_ids
        return await self._send(request, gen, ready, answer, headers, obs, tail_ids)

    async def answer_loop(
        self,
        request: web.Request,
        loop: ToolLoop,
        gen: ChoiceGroup,
        headers: dict[str, str],
        obs: RequestObserver,
    ) -> web.StreamResponse:
        try:
            out = await loop.complete(gen)
        finally:
            request[TOOL_CALLS] = loop.calls_run
        gen.stats.finish_reason = out.finish_reason
        answer = Answer(out.content, tuple(out.tool_calls or ()), out.finish_reason)
        # The loop's last prompt is not this turn's: no tail (the next turn assembles).
        return await self._send(request, gen, None, answer, headers, obs, None)

    async def _send(
        self,
        request: web.Request,
        gen: ChoiceGroup,
        ready: Prepared | None,
        answer: Answer,
        headers: dict[str, str],
        obs: RequestObserver,
        answer_ids: Any,
    ) -> web.StreamResponse:
        items = output_items(answer)
        body = await self._stored(request, gen, ready, answer, items, answer_ids)
        if not self.req or not self.req.stream:
            answered = web.json_response(body, headers=headers)
            await answered.prepare(request)
            await answered.write_eof()
            obs.delivered = True
            return answered
        events = EventStream(await open_stream(request, headers))
        async with _failures_as_events(events, obs):
            await self._open_events(events)
            for index, item in enumerate(items):
                if item.type == "message":
                    await events.message(item, index)
                else:
                    await events.call(item, index)
            await self._close_events(events, body, obs)
        return events.resp

    async def _stream(
        self,
        request: web.Request,
        gen: ChoiceGroup,
        ready: Prepared,
        headers: dict[str, str],
        obs: RequestObserver,
        calls: ToolFormat | None,
    ) -> web.StreamResponse:
        """The answer as it is generated: text deltas, and calls (when the answer is parsed for
        them) as items of their own (gateway/responses/live.py)."""
        events = EventStream(await open_stream(request, headers))
        async with _failures_as_events(events, obs):
            await self._open_events(events)
            live, reason = LiveOutput(events, calls), "stop"
            async with contextlib.aclosing(gen.pieces()) as pieces:
                async for piece in pieces:
                    if piece.finish_reason is not None:
                        reason = piece.finish_reason
                    elif piece.text:
                        await live.feed(piece.text)
            await live.close()
            answer = live.answer(reason)
            gen.stats.finish_reason = answer.finish_reason
            items = live.items(answer)
            ids = gen.choices[0].token_ids
            body = await self._stored(request, gen, ready, answer, items, ids)
            await live.finish(items)
            await self._close_events(events, body, obs)
        return events.resp

    async def _open_events(self, events: EventStream) -> None:
        assert self.req is not None
        started = response_body(
            self.rid,
            self.req,
            created_at=self.created_at,
            status="in_progress",
            output=[],
            usage=None,
            store=self.store,
        )
        await events.send("response.created", response=started)
        await events.send("response.in_progress", response=started)

    async def _close_events(
        self, events: EventStream, body: dict[str, Any], obs: RequestObserver
    ) -> None:
        kind = "response.completed" if body["status"] == "completed" else "response.incomplete"
        await events.send(kind, response=body)
        obs.delivered = True
        await events.resp.write_eof()

    async def _stored(
        self,
        request: web.Request,
        gen: ChoiceGroup,
        ready: Prepared | None,
        answer: Answer,
        items: list[NewItem],
        answer_ids: Any,
    ) -> dict[str, Any]:
        """The response object; stored first (with the turn's tail) when ``store``."""
        assert self.req is not None and self.scope is not None
        usage = usage_of(gen.stats)
        body = response_body(
            self.rid,
            self.req,
            created_at=self.created_at,
            status=answer.status,
            output=item_bodies(items),
            usage=usage,
            store=self.store,
            incomplete=answer.incomplete_reason,
        )
        if not self.store:
            return body
        tail = None
        if ready is not None and answer_ids is not None and self.prefix is not None:
            assert self.tokenizer is not None
            digest_ = self._digest(self.prefix)
            tail = tail_of(
                self.tokenizer,
                self.prefix,
                ready.prompt_ids,
                answer_ids,
                digest_,
                ready.plan.closer_ids(self.tokenizer),
            )
        new = NewResponse(
            id=self.rid,
            scope=self.scope,
            model=self.req.model,
            status=answer.status,
            created_at=utcnow(),
            body=body,
            inputs=tuple(self.inputs),
            outputs=tuple(items),
            conversation_id=self.req.conversation_id,
            previous_response_id=self.req.previous_response_id,
            key_id=None,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cached_tokens=usage.cached_tokens,
            tail=tail,
        )
        await ConversationStore(request.app[STATE].store).save_response(new)
        return body
