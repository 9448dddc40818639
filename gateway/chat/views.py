"""``POST /v1/chat/completions`` and ``GET /v1/models``.

Order of checks (each failure is an OpenAI-shaped error; nothing reaches the engine before the
limiter admitted it)::

    key (401/403) -> body (400, 413) -> model (404) -> client system policy, widget n (400)
    -> prompt bounds: messages, characters (400; no rendering or tokenizing yet)
    -> prompt assembly (small: on the loop; large: on the tokenize threads, 429 / 503 when the
       tenant's / everyone's queue is full) -> context length, logprobs size (400)
    -> rate limit (429 + headers; 400 for n above a concurrency limit) -> engine -> JSON or SSE

Every refusal after the key and before admission is charged: one request from the RPM of each of
the request's scopes (``Limiter.charge``), so refused requests cost a client as admitted ones do;
a client already out of requests gets the 429 instead of the refusal. The steps before the
engine live in gateway/chat/admission.py.

The lease, TPM reservation and pin reference are given back in ``finally`` blocks, which also
run when aiohttp cancels the handler because the client went away (handler cancellation is on),
so a disconnect aborts the engine request at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from aiohttp import web

from engine.api import GenerateOptions
from gateway.access.auth import Principal
from gateway.chat.admission import (
    HeldLimits,
    Prepared,
    PromptHook,
    admit,
    charged,
    prepare,
    read_body,
    request_scopes,
)
from gateway.chat.cache_scope import request_cache_scope
from gateway.chat.generation import ChoiceGroup, GenerationStats, Piece
from gateway.chat.kept_turn import begin_turn, turn_of
from gateway.chat.ledger import PROMPT_VERSION, record_chat, record_refusal, reserve_budget
from gateway.chat.logprobs import LogprobFormatter
from gateway.chat.observe import RequestObserver
from gateway.chat.schemas import (
    ChatRequest,
    choice_body,
    chunk_body,
    completion_body,
    usage_body,
)
from gateway.chat.sse import open_stream, send_done, send_event
from gateway.chat.tools.answer import ToolStream, complete
from gateway.chat.tools.formats import ToolFormat
from gateway.chat.tools.loop import ToolLoop, respond, tool_loop
from gateway.chat.tools.run.runner import TOOL_RUNNER
from gateway.chat.tools.stream import stream as stream_tools
from gateway.chat.turn import Turn
from gateway.context import SETTINGS, STATE, TELEMETRY, GatewayState
from gateway.errors import REQUEST_ID, TENANT, ApiError, new_request_id, to_api_error
from gateway.lifecycle.drain import SHUTDOWN_CODE, shutdown_error
from gateway.prompts.pins import PromptEntry
from gateway.ratelimit import Lease

CLIENT_CLOSED = 499  # status recorded when the client went away mid-request
UNKNOWN_TENANT = ""  # metrics label of requests refused before the key was known


async def list_models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    rid = request[REQUEST_ID] = new_request_id()
    await state.keys.authenticate(request)
    model = {"id": state.model_name, "object": "model", "created": 0, "owned_by": "kvgate"}
    return web.json_response({"object": "list", "data": [model]}, headers={"x-request-id": rid})


class ChatTurn:
    """``POST /v1/chat/completions``: the body as sent, the answer in chat's shapes."""

    rid_prefix = "chatcmpl-"

    def __init__(self) -> None:
        self.body: ChatRequest | None = None
        self.rid = ""

    async def read(
        self, request: web.Request, state: GatewayState, principal: Principal, rid: str
    ) -> ChatRequest:
        self.rid = rid
        self.body = await read_body(request, state, principal)
        # the widget's history: its conversation checked before anything is admitted
        await begin_turn(request, principal, self.body.messages)
        return self.body

    def prompt_hook(self) -> PromptHook | None:
        return None

    def engine_options(
        self, request: web.Request, principal: Principal, options: GenerateOptions, shared: int
    ) -> GenerateOptions:
        return options

    async def answer(
        self,
        request: web.Request,
        gen: ChoiceGroup,
        ready: Prepared,
        headers: dict[str, str],
        obs: RequestObserver,
    ) -> web.StreamResponse:
        assert self.body is not None
        calls = ready.plan.calls
        if self.body.stream:
            return await _stream(request, gen, self.body, self.rid, headers, obs, calls)
        return await _complete(request, gen, self.body, self.rid, headers, obs, calls)

    async def answer_loop(
        self,
        request: web.Request,
        loop: ToolLoop,
        gen: ChoiceGroup,
        headers: dict[str, str],
        obs: RequestObserver,
    ) -> web.StreamResponse:
        assert self.body is not None
        answer = stream_tools if self.body.stream else respond
        return await answer(request, loop, gen, self.rid, headers, obs)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await serve_turn(request, ChatTurn())


async def serve_turn(request: web.Request, turn: Turn) -> web.StreamResponse:
    """One request through the chat path (the order of checks above); ``turn`` reads its body
    and writes its answer."""
    started = time.monotonic()
    state = request.app[STATE]
    tenant_id = UNKNOWN_TENANT
    rid = new_request_id(turn.rid_prefix)
    request[REQUEST_ID] = rid  # x-request-id and the refusal log line of an early error
    principal: Principal | None = None
    try:
        if state.draining:
            raise shutdown_error()
        principal = await state.keys.authenticate(request)
        tenant_id = request[TENANT] = principal.runtime.tenant_id
        body = await charged(request, principal, turn.read(request, state, principal, rid))
    except Exception as exc:
        # Refused before a request span exists (bad key or body, body too large, database
        # down): counted here, logged by the error middleware (one request_refused line).
        request.app[TELEMETRY].metrics.requests.labels(tenant_id, str(_status_of(exc))).inc()
        record_refusal(
            request, principal, rid, started, _status_of(exc), getattr(exc, "code", None)
        )
        raise
    obs = RequestObserver(
        request.app[TELEMETRY],
        rid,
        principal.runtime.tenant_id,
        started,
        key_id=principal.identity.key_id,
        end_user_id=principal.end_user_id or body.user,
    )
    with obs.request_span(body, request.headers), state.drain.track():
        status, stats, error = CLIENT_CLOSED, None, None
        try:
            resp, stats = await _serve(request, state, principal, body, rid, obs, turn)
            status = resp.status
            error = obs.stream_error
            return resp
        except ApiError as exc:
            status, error = exc.status, exc.code or exc.type
            raise
        except asyncio.CancelledError:
            # The outcome is what the client got: a response written in full is a 200 with
            # its tokens, even when the client closes before the handler's clean-up ends.
            if obs.delivered:
                status = 200
            elif state.drain.take_cut():  # the shutdown deadline, before any response byte
                status, error = 503, SHUTDOWN_CODE
                raise shutdown_error() from None
            else:
                error = "client_disconnected"
            raise
        except Exception as exc:
            status, error = _status_of(exc), type(exc).__name__
            raise
        finally:
            obs.finish(status, stats or obs.stats, error)
            record_chat(request, principal, body, obs, error)  # the usage ledger


def _stream_failure(exc: BaseException) -> ApiError:
    if isinstance(exc, asyncio.CancelledError):
        return shutdown_error()
    return to_api_error(exc) or ApiError(500, "internal server error", type_="internal_error")


def _status_of(exc: BaseException) -> int:
    """The HTTP status the error middleware answers ``exc`` with."""
    if isinstance(exc, ApiError | web.HTTPException):
        return exc.status
    mapped = to_api_error(exc)
    return mapped.status if mapped else 500


async def _serve(
    request: web.Request,
    state: GatewayState,
    principal: Principal,
    body: ChatRequest,
    rid: str,
    obs: RequestObserver,
    turn: Turn,
) -> tuple[web.StreamResponse, GenerationStats]:
    rt = principal.runtime
    entry = state.pins.begin(rt)
    if entry.version is not None:
        request[PROMPT_VERSION] = entry.version
    gen: ChoiceGroup | None = None
    lease: Lease | None = None
    held: HeldLimits | None = None
    try:
        hook = turn.prompt_hook()
        preparing = prepare(request, state, entry, body, rt, obs, hook)
        ready = await charged(request, principal, preparing)
        prompt_ids, params = ready.prompt_ids, ready.params
        n_prompt, max_tokens = len(prompt_ids), params.max_tokens
        # n choices: the prompt once (the engine prefills it once, the choices share its KV
        # blocks, and usage reports it once), up to max_tokens for each choice; and n
        # concurrency slots, one per engine request.
        reserve = n_prompt + body.num_choices * max_tokens
        await reserve_budget(request, principal, body.model, n_prompt, reserve - n_prompt)
        # The lease exists before the admission call, so ``finally`` gives back whatever that
        # call took, even when it never answered (timeout, disconnect).
        scopes = request_scopes(request, principal)
        lease = Lease.new(rt.tenant_id, scopes, reserve, slots=body.num_choices)
        decision = await admit(state, lease, obs)
        held = HeldLimits(request, principal, body.model, lease)
        headers = {**decision.headers(), "x-request-id": rid}
        # blocks past the tenant prefix are the end user's own (gateway/chat/cache_scope.py)
        scope = request_cache_scope(request, principal, body.user, ready.shared_tokens)
        options = GenerateOptions(entry.namespace, rid, cache_scope=scope, **principal.fair_share())
        options = turn.engine_options(request, principal, options, ready.shared_tokens)
        gen = ChoiceGroup(
            state.engine,
            state.tokenizer,
            prompt_ids,
            params,
            options,
            n=body.num_choices,
            stops=body.stop_strings,
            streamed=body.stream,
        )
        await gen.start()
        obs.stats = gen.stats  # admitted by the engine: recorded whatever ends the request
        tools = request.app[SETTINGS].tools
        runner = request.app.get(TOOL_RUNNER)
        loop = tool_loop(state, runner, rt, entry, body, ready, options, tools, held.admit_step)
        if loop is not None:  # the gateway runs the tenant's tools
            return await turn.answer_loop(request, loop, gen, headers, obs), gen.stats
        return await turn.answer(request, gen, ready, headers, obs), gen.stats
    finally:
        # Shielded: a client disconnect cancels this handler, but the engine request, the lease
        # and the pin reference must still be given back.
        held_lease = held.lease if held is not None else lease  # grown by later steps
        await asyncio.shield(_give_back(state, entry, gen, held_lease))


async def _give_back(
    state: GatewayState, entry: PromptEntry, gen: ChoiceGroup | None, lease: Lease | None
) -> None:
    stats = gen.stats if gen is not None else None
    ran = stats is not None and stats.engine_metrics is not None  # the engine admitted it
    try:
        if gen is not None:
            await gen.close()  # aborts the engine request if it is still running
    finally:
        try:
            if lease is not None:
                # every step's prompt and what the engine generated (until an abort)
                used = stats.prompt_tokens + stats.completion_tokens if ran and stats else 0
                await state.limiter.release(lease, used)
        finally:
            prompt = stats.prompt_tokens if ran and stats else 0
            await state.pins.end(entry, prompt, stats.cached_tokens if ran and stats else 0)


async def _complete(
    request: web.Request,
    gen: ChoiceGroup,
    body: ChatRequest,
    rid: str,
    headers: dict[str, str],
    obs: RequestObserver,
    calls: ToolFormat | None,
) -> web.Response:
    fmt = LogprobFormatter(gen.tokenizer)
    choices = []
    for c in await gen.results():
        if calls is None:
            choices.append(choice_body(c.index, c.text, c.finish_reason, fmt.body(c.logprobs)))
            continue
        done = complete(calls, c.text, c.finish_reason)
        if c.index == 0:
            gen.stats.finish_reason = done.finish_reason  # "tool_calls" in the log and span
        logprobs = fmt.body(c.logprobs)
        body_ = choice_body(c.index, done.content, done.finish_reason, logprobs, done.tool_calls)
        choices.append(body_)
    s = gen.stats
    turn = turn_of(request)
    if turn is not None:  # kept before the answer leaves: a reload right after sees it
        turn.add(str(choices[0]["message"]["content"] or ""))
        await turn.save(body.model, s, rid)
    usage = usage_body(s.prompt_tokens, s.completion_tokens, s.cached_tokens)
    out = completion_body(rid, body.model, choices, usage)
    resp = web.json_response(out, headers=headers)
    # Sent now, so the limiter release in ``finally`` is not on the client's critical path.
    await resp.prepare(request)
    await resp.write_eof()
    obs.delivered = True  # written in full: the client closing now is not a disconnect
    return resp


async def _stream(
    request: web.Request,
    gen: ChoiceGroup,
    body: ChatRequest,
    rid: str,
    headers: dict[str, str],
    obs: RequestObserver,
    calls: ToolFormat | None,
) -> web.StreamResponse:
    resp = await open_stream(request, headers)
    created = int(time.time())
    for i in range(body.num_choices):
        role = {"role": "assistant"}
        await send_event(resp, chunk_body(rid, body.model, created, role, index=i))
    fmt = LogprobFormatter(gen.tokenizer) if gen.wants_logprobs else None
    tools = ToolStream(calls, body.num_choices) if calls is not None else None
    turn = turn_of(request)
    try:
        async with contextlib.aclosing(gen.pieces()) as pieces:
            async for piece in pieces:
                if turn is not None and piece.index == 0 and piece.text:
                    turn.add(piece.text)
                if tools is None:
                    await send_event(resp, _piece_chunk(piece, rid, body.model, created, fmt))
                    continue
                for chunk in _tool_chunks(tools, piece, gen, rid, body.model, created, fmt):
                    await send_event(resp, chunk)
    except ConnectionError:
        raise  # the client is gone: nothing to tell it
    except (Exception, asyncio.CancelledError) as exc:
        # Headers are out: the failure becomes an error event, then [DONE] (OpenAI style).
        # Cancelled: the client went away (re-raised), or the shutdown deadline came.
        if isinstance(exc, asyncio.CancelledError) and not request.app[STATE].drain.take_cut():
            raise
        err = _stream_failure(exc)
        obs.stream_error = err.code or err.type
        obs.cut_by_shutdown = isinstance(exc, asyncio.CancelledError)
        await send_event(resp, err.body())
        await send_done(resp)
        obs.delivered = True
        await resp.write_eof()
        return resp
    s = gen.stats
    if turn is not None:  # kept before the stream ends: a reload right after sees it
        await turn.save(body.model, s, rid)
    if body.include_usage:
        usage = usage_body(s.prompt_tokens, s.completion_tokens, s.cached_tokens)
        await send_event(resp, chunk_body(rid, body.model, created, None, usage=usage))
    await send_done(resp)
    obs.delivered = True  # the client has it all; closing now is not a disconnect
    await resp.write_eof()
    return resp


def _tool_chunks(
    tools: ToolStream,
    piece: Piece,
    gen: ChoiceGroup,
    rid: str,
    model: str,
    created: int,
    fmt: LogprobFormatter | None,
) -> list[dict[str, object]]:
    """A piece of a choice that may call tools: its content and call deltas, or its end."""
    out = []
    for d in tools.deltas(piece.index, piece.text, piece.logprobs, piece.finish_reason):
        if d.finish_reason is not None and piece.index == 0:
            gen.stats.finish_reason = d.finish_reason  # "tool_calls" in the log and span
        lp = fmt.body(d.logprobs) if fmt is not None else None
        chunk = chunk_body(
            rid, model, created, d.delta, d.finish_reason, index=piece.index, logprobs=lp
        )
        out.append(chunk)
    return out


def _piece_chunk(
    piece: Piece, rid: str, model: str, created: int, fmt: LogprobFormatter | None
) -> dict[str, object]:
    """A content chunk, or the choice's final chunk (empty delta, finish reason)."""
    if piece.finish_reason is not None:
        return chunk_body(rid, model, created, {}, piece.finish_reason, index=piece.index)
    logprobs = fmt.body(piece.logprobs) if fmt is not None else None
    delta = {"content": piece.text}
    return chunk_body(rid, model, created, delta, index=piece.index, logprobs=logprobs)
