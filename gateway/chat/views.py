"""``POST /v1/chat/completions`` and ``GET /v1/models``.

Order of checks (each failure is an OpenAI-shaped error; nothing reaches the engine before the
limiter admitted it)::

    key (401/403) -> body (400) -> model (404) -> client system policy, widget n (400)
    -> prompt assembly -> context length, logprobs size (400) -> rate limit (429 + headers;
    400 for n above a concurrency limit) -> engine -> JSON or SSE

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
from engine.params import SamplingParams
from gateway.auth import Principal
from gateway.chat.bounds import check_choices, check_logprobs_size, too_wide_error
from gateway.chat.cache_scope import request_cache_scope
from gateway.chat.generation import ChoiceGroup, GenerationStats, Piece
from gateway.chat.logprobs import LogprobFormatter
from gateway.chat.observe import RequestObserver
from gateway.chat.prompt import assemble, check_client_system
from gateway.chat.schemas import (
    ChatRequest,
    choice_body,
    chunk_body,
    completion_body,
    parse_chat_request,
    usage_body,
)
from gateway.chat.sse import open_stream, send_done, send_event
from gateway.context import SETTINGS, STATE, TELEMETRY, GatewayState
from gateway.drain import SHUTDOWN_CODE, shutdown_error
from gateway.errors import REQUEST_ID, TENANT, ApiError, new_request_id, to_api_error
from gateway.pins import PromptEntry
from gateway.ratelimit import Decision, Lease, Scope
from gateway.ratelimit.scopes import VisitorDefaults, admission_scopes, client_address
from gateway.ratelimit.types import REASON_TOO_WIDE
from gateway.settings import ModelSettings
from tenants.runtime import TenantRuntime

CLIENT_CLOSED = 499  # status recorded when the client went away mid-request
UNKNOWN_TENANT = ""  # metrics label of requests refused before the key was known


async def list_models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    await state.keys.authenticate(request)
    model = {"id": state.model_name, "object": "model", "created": 0, "owned_by": "kvgate"}
    return web.json_response({"object": "list", "data": [model]})


async def chat_completions(request: web.Request) -> web.StreamResponse:
    started = time.monotonic()
    state = request.app[STATE]
    tenant_id = UNKNOWN_TENANT
    rid = new_request_id("chatcmpl-")
    request[REQUEST_ID] = rid  # x-request-id and the refusal log line of an early error
    try:
        if state.draining:
            raise shutdown_error()
        principal = await state.keys.authenticate(request)
        tenant_id = request[TENANT] = principal.runtime.tenant_id
        body = parse_chat_request(await request.read())
        if body.model != state.model_name:
            raise ApiError(
                404,
                "the requested model does not exist",  # not quoted: it may be anything
                code="model_not_found",
                param="model",
            )
        check_client_system(
            body.messages, principal.allow_client_system, widget=principal.is_widget
        )
        check_choices(
            body.num_choices,
            widget=principal.is_widget,
            max_choices=principal.runtime.widget.max_choices,
        )
    except Exception as exc:
        # Refused before a request span exists (bad key or body, body too large, database
        # down): counted here, logged by the error middleware (one request_refused line).
        request.app[TELEMETRY].metrics.requests.labels(tenant_id, str(_status_of(exc))).inc()
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
            resp, stats = await _serve(request, state, principal, body, rid, obs)
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
) -> tuple[web.StreamResponse, GenerationStats]:
    rt = principal.runtime
    entry = state.pins.begin(rt)
    gen: ChoiceGroup | None = None
    lease: Lease | None = None
    n_prompt = 0
    try:
        prompt_ids = assemble(state.tokenizer, entry.prefix, body.messages)
        n_prompt = len(prompt_ids)
        settings = request.app[SETTINGS]
        max_tokens = resolve_max_tokens(
            body, rt, n_prompt, state.engine.info.max_model_len, settings.model.default_max_tokens
        )
        obs.set_max_tokens(max_tokens)
        if not body.stream:
            check_logprobs_size(body.num_choices, max_tokens, body.num_logprobs)
        params = sampling_params(body, max_tokens, settings.model, state.tokenizer.vocab_size)
        # n choices: the prompt once (the engine prefills it once, the choices share its KV
        # blocks, and usage reports it once), up to max_tokens for each choice; and n
        # concurrency slots, one per engine request.
        reserve = n_prompt + body.num_choices * max_tokens
        # The lease exists before the admission call, so ``finally`` gives back whatever that
        # call took, even when it never answered (timeout, disconnect).
        scopes = _scopes(request, principal)
        lease = Lease.new(rt.tenant_id, scopes, reserve, slots=body.num_choices)
        decision = await _admit(state, lease, obs)
        headers = {**decision.headers(), "x-request-id": rid}
        # blocks past the tenant prefix are the end user's own (gateway/chat/cache_scope.py)
        scope = request_cache_scope(request, principal, body.user, len(entry.prefix.ids))
        options = GenerateOptions(entry.namespace, rid, cache_scope=scope)
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
        if body.stream:
            return await _stream(request, gen, body, rid, headers, obs), gen.stats
        return await _complete(request, gen, body, rid, headers, obs), gen.stats
    finally:
        # Shielded: a client disconnect cancels this handler, but the engine request, the lease
        # and the pin reference must still be given back.
        await asyncio.shield(_give_back(state, entry, gen, lease, n_prompt))


async def _give_back(
    state: GatewayState,
    entry: PromptEntry,
    gen: ChoiceGroup | None,
    lease: Lease | None,
    n_prompt: int,
) -> None:
    stats = gen.stats if gen is not None else None
    ran = stats is not None and stats.engine_metrics is not None  # the engine admitted it
    try:
        if gen is not None:
            await gen.close()  # aborts the engine request if it is still running
    finally:
        try:
            if lease is not None:
                used = n_prompt + stats.completion_tokens if ran and stats else 0
                await state.limiter.release(lease, used)
        finally:
            prompt = stats.prompt_tokens if ran and stats else 0
            await state.pins.end(entry, prompt, stats.cached_tokens if ran and stats else 0)


def resolve_max_tokens(
    body: ChatRequest, rt: TenantRuntime, n_prompt: int, max_model_len: int, default: int
) -> int:
    cap = rt.limits.max_output_tokens or default
    room = max_model_len - n_prompt
    if room < 1:
        raise ApiError(
            400,
            f"this model's maximum context length is {max_model_len} tokens; the messages "
            f"resulted in {n_prompt} tokens",
            param="messages",
            code="context_length_exceeded",
        )
    requested = body.requested_max_tokens
    if requested is None:
        return min(default, cap, room)
    if requested > cap:
        raise ApiError(
            400,
            f"max_tokens is too large: {requested}; this tenant allows at most {cap}",
            param="max_tokens",
            code="max_tokens_exceeded",
        )
    if requested > room:
        raise ApiError(
            400,
            f"this model's maximum context length is {max_model_len} tokens; you requested "
            f"{n_prompt + requested} tokens ({n_prompt} in the messages, {requested} for the "
            "completion)",
            param="max_tokens",
            code="context_length_exceeded",
        )
    return requested


def sampling_params(
    body: ChatRequest, max_tokens: int, defaults: ModelSettings, vocab_size: int
) -> SamplingParams:
    """The engine's parameters: the request's, else the model's defaults (settings)."""
    bias = body.bias
    if any(tok >= vocab_size for tok, _ in bias):
        raise ApiError(
            400,
            f"invalid key in logit_bias: token ids must be below {vocab_size}",
            param="logit_bias",
        )
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=_given(body.temperature, defaults.default_temperature),
        top_p=_given(body.top_p, defaults.default_top_p),
        top_k=body.top_k or 0,
        min_p=body.min_p or 0.0,
        seed=body.seed,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=_given(body.frequency_penalty, defaults.default_frequency_penalty),
        repetition_penalty=_given(body.repetition_penalty, defaults.default_repetition_penalty),
        logit_bias=bias,
        logprobs=body.num_logprobs,
    )


def _given(value: float | None, default: float) -> float:
    return default if value is None else value


def _scopes(request: web.Request, principal: Principal) -> tuple[Scope, ...]:
    rl = request.app[SETTINGS].ratelimit
    address = client_address(
        request.remote, request.headers.get("X-Forwarded-For"), rl.trusted_proxies
    )
    defaults = VisitorDefaults(rl.visitor_rpm, rl.visitor_tpm, rl.visitor_max_concurrency)
    return admission_scopes(
        principal.runtime, principal.identity, principal.end_user_id, address, defaults
    )


async def _admit(state: GatewayState, lease: Lease, obs: RequestObserver) -> Decision:
    with obs.child("gen_ai.rate_limit"):
        decision = await state.limiter.acquire(lease)
    if decision.allowed:
        return decision
    obs.rejected(decision.reason or "unknown", decision.scope or "tenant")
    if decision.reason == REASON_TOO_WIDE:  # n above max_concurrency: never admissible
        limit = next(s.limits for s in lease.scopes if s.kind == decision.scope)
        raise too_wide_error(lease.slots, decision.scope or "tenant", limit.max_concurrency)
    raise rate_limit_error(decision)


def rate_limit_error(decision: Decision) -> ApiError:
    what = {
        "requests": "requests per minute",
        "tokens": "tokens per minute",
        "concurrency": "concurrent requests",
        "too_large": "tokens per minute (this request alone exceeds the limit)",
    }.get(decision.reason or "", "rate limit")
    return ApiError(
        429,
        f"rate limit reached for {what} (scope: {decision.scope or 'tenant'})",
        type_="rate_limit_exceeded",
        code="rate_limit_exceeded",
        headers=decision.headers(),
    )


async def _complete(
    request: web.Request,
    gen: ChoiceGroup,
    body: ChatRequest,
    rid: str,
    headers: dict[str, str],
    obs: RequestObserver,
) -> web.Response:
    fmt = LogprobFormatter(gen.tokenizer)
    choices = [
        choice_body(c.index, c.text, c.finish_reason, fmt.body(c.logprobs))
        for c in await gen.results()
    ]
    s = gen.stats
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
) -> web.StreamResponse:
    resp = await open_stream(request, headers)
    created = int(time.time())
    for i in range(body.num_choices):
        role = {"role": "assistant"}
        await send_event(resp, chunk_body(rid, body.model, created, role, index=i))
    fmt = LogprobFormatter(gen.tokenizer) if gen.wants_logprobs else None
    try:
        async with contextlib.aclosing(gen.pieces()) as pieces:
            async for piece in pieces:
                await send_event(resp, _piece_chunk(piece, rid, body.model, created, fmt))
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
    if body.include_usage:
        usage = usage_body(s.prompt_tokens, s.completion_tokens, s.cached_tokens)
        await send_event(resp, chunk_body(rid, body.model, created, None, usage=usage))
    await send_done(resp)
    obs.delivered = True  # the client has it all; closing now is not a disconnect
    await resp.write_eof()
    return resp


def _piece_chunk(
    piece: Piece, rid: str, model: str, created: int, fmt: LogprobFormatter | None
) -> dict[str, object]:
    """A content chunk, or the choice's final chunk (empty delta, finish reason)."""
    if piece.finish_reason is not None:
        return chunk_body(rid, model, created, {}, piece.finish_reason, index=piece.index)
    logprobs = fmt.body(piece.logprobs) if fmt is not None else None
    delta = {"content": piece.text}
    return chunk_body(rid, model, created, delta, index=piece.index, logprobs=logprobs)
