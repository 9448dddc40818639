"""Admission of a chat request, before the engine: body, cheap bounds, prompt, parameters,
limits (the order of checks is in gateway/chat/views.py's docstring).

Every refusal after the key and before admission goes through :func:`charged`: it first costs
the client one request of its RPM (``Limiter.charge``); a client with none left gets that 429.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from aiohttp import web

from engine.params import SamplingParams
from engine.text.tokenizer import Tokenizer
from gateway.access.auth import Principal
from gateway.access.visitor import request_visitor
from gateway.chat.bounds import (
    check_choices,
    check_logprobs_size,
    message_cap,
    too_wide_error,
)
from gateway.chat.ledger import reserve_budget
from gateway.chat.observe import RequestObserver
from gateway.chat.prompt import (
    assemble,
    check_bounds,
    check_client_system,
    context_length_error,
    shared_prefix,
)
from gateway.chat.schemas import ChatRequest, parse_chat_request
from gateway.chat.tools.models import ToolDef
from gateway.chat.tools.plan import OutputPlan, for_engine, plan_output
from gateway.chat.tools.render import tool_texts
from gateway.chat.tools.tenant import request_choice, tenant_tool_defs
from gateway.chat.tools.validate import check_plan, needs_compile
from gateway.context import SETTINGS, STATE, TELEMETRY, GatewayState
from gateway.errors import ApiError
from gateway.prompts.pins import PromptEntry
from gateway.prompts.tenant_prefix import TenantPrefix
from gateway.prompts.tokenize_pool import COMPILE_WORK, prompt_work
from gateway.ratelimit import Decision, Lease, LimiterUnavailable, Scope
from gateway.ratelimit.scopes import VisitorDefaults, admission_scopes
from gateway.ratelimit.types import REASON_TOO_WIDE
from gateway.settings import ModelSettings
from tenants.runtime import TenantRuntime

T = TypeVar("T")


async def read_body(request: web.Request, state: GatewayState, principal: Principal) -> ChatRequest:
    cap = message_cap(state.engine.info.max_model_len)
    declared = [t.name for t in principal.runtime.tool_policy.tools]
    body = parse_chat_request(await body_bytes(request, principal), cap, declared)
    check_body(state, principal, body)
    return body


def check_body(state: GatewayState, principal: Principal, body: ChatRequest) -> None:
    """What a parsed request must satisfy for this key: the model, the tenant's client-system
    policy, the widget's rules (also for a Responses request, once it is a chat request)."""
    if body.model != state.model_name:
        raise ApiError(
            404,
            "the requested model does not exist",  # not quoted: it may be anything
            code="model_not_found",
            param="model",
        )
    check_client_system(body.messages, principal.allow_client_system, widget=principal.is_widget)
    if principal.is_widget:
        check_widget_tools(body)
    check_choices(
        body.num_choices,
        widget=principal.is_widget,
        max_choices=principal.runtime.widget.max_choices,
    )


async def body_bytes(request: web.Request, principal: Principal) -> bytes:
    """The decoded body; widget traffic's is bounded by ``KVGATE_WIDGET_MAX_BODY_BYTES`` (the
    app's ``client_max_size`` bounds every other). Parsing JSON holds the event loop for about
    as long as the body has values (1 MiB of tiny values: tens of ms), so public keys, which
    anyone may use, send smaller bodies; a widget conversation never needs more."""
    if not principal.is_widget:
        return await request.read()
    limit = request.app[SETTINGS].widget.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise _widget_body_too_large(limit)
    parts, size = [], 0
    async for chunk in request.content.iter_chunked(64 << 10):
        size += len(chunk)
        if size > limit:  # compressed bodies: the decoded size counts
            raise _widget_body_too_large(limit)
        parts.append(chunk)
    return b"".join(parts)


def check_widget_tools(body: ChatRequest) -> None:
    """Widget keys are public: a page's visitor may not declare tools (a tenant's tools are set
    server-side), send tool turns or ask for a schema (a grammar compile anyone could make the
    gateway pay for). The widget itself never sends them."""
    fields = (
        ("tools", bool(body.tools)),
        ("tool_choice", body.tool_choice not in (None, "none")),
        (
            "response_format",
            body.response_format is not None and body.response_format.type != "text",
        ),
    )
    for name, used in fields:
        if used:
            raise _widget_refusal(name, f"{name} is not accepted from the widget")
    for i, m in enumerate(body.messages):
        if m.tool_calls or m.role == "tool":
            raise _widget_refusal(f"messages[{i}]", "tool turns are not accepted from the widget")


def _widget_refusal(param: str, message: str) -> ApiError:
    return ApiError(400, message, param=param, code="not_allowed_for_widget")


def _widget_body_too_large(limit: int) -> ApiError:
    return ApiError(
        413,
        f"request body too large for widget traffic: at most {limit} bytes",
        code="request_too_large",
    )


async def charged(request: web.Request, principal: Principal, step: Awaitable[T]) -> T:
    """``step``'s result. A refusal from it (a 4xx) first costs the client one request of its
    RPM; a client with none left gets that 429 instead."""
    try:
        return await step
    except (ApiError, web.HTTPException) as exc:
        if 400 <= exc.status < 500:
            await _charge_refusal(request, principal, exc)
        raise


async def _charge_refusal(request: web.Request, principal: Principal, refusal: Exception) -> None:
    lease = Lease.new(principal.runtime.tenant_id, request_scopes(request, principal), 0)
    try:
        decision = await request.app[STATE].limiter.charge(lease)
    except LimiterUnavailable:
        return  # failing closed with Redis away: nothing is admitted, the refusal stands
    if not decision.allowed:
        metrics = request.app[TELEMETRY].metrics
        reason, scope = decision.reason or "unknown", decision.scope or "tenant"
        metrics.ratelimit_rejections.labels(lease.tenant, reason, scope).inc()
        raise rate_limit_error(decision) from refusal


# A request's own prompt ids (a stored conversation's warm tail: gateway/responses/tail.py),
# or None for the ordinary assembly; called where the prompt is built (the tokenize threads).
PromptHook = Callable[[Tokenizer, TenantPrefix, OutputPlan, Sequence[ToolDef]], list[int] | None]


@dataclass(frozen=True)
class Prepared:
    """A request ready for the limiter: its prompt, its parameters (a grammar among them), how
    many leading prompt tokens are the tenant prefix's (every end user's), and what its answer
    is parsed for."""

    prompt_ids: list[int]
    params: SamplingParams
    shared_tokens: int
    plan: OutputPlan


async def prepare(
    request: web.Request,
    state: GatewayState,
    entry: PromptEntry,
    body: ChatRequest,
    rt: TenantRuntime,
    obs: RequestObserver,
    hook: PromptHook | None = None,
) -> Prepared:
    """Prompt ids and sampling parameters, or the refusal: cheap bounds first, then the prompt
    and the grammar check (on the loop or the tokenize threads), then the limits that need its
    length."""
    max_len = state.engine.info.max_model_len
    tok = state.tokenizer
    client_tools = body.tools or []
    chars = check_bounds(body.messages, max_len, tok.text_bound, extra=tool_texts(client_tools))
    tools = [*tenant_tool_defs(rt.tool_policy), *client_tools]
    choice = request_choice(body.tool_choice, body.response_format, rt.tool_policy)
    plan = plan_output(
        tools, choice, body.parallel_tool_calls, body.response_format, tok.chat_template
    )
    plan = for_engine(plan, state.engine.info.grammars, choice, body.parallel_tool_calls)
    # The tenant's tools are in its prefix; a fallback template gets the client's after them.
    rendered = tools if plan.native else client_tools
    limit = rt.limits.max_concurrency  # requests that may wait for the pool, as for the engine
    if plan.grammar is not None and needs_compile(plan, tok):
        # A new grammar: one compile on the threads, charged to this tenant, shared by its
        # requests with the same grammar waiting meanwhile; after it, checking is a lookup.
        compile_plan = functools.partial(check_plan, plan, tok)
        key = plan.grammar.digest
        await state.prompts.run(rt.tenant_id, COMPILE_WORK, compile_plan, key=key, limit=limit)

    def build() -> list[int]:
        ids = hook(tok, entry.prefix, plan, rendered) if hook is not None else None
        if ids is None:
            rendering = plan.rendering(body.messages, rendered)
            ids = assemble(tok, entry.prefix, body.messages, max_len, rendering=rendering)
        ids = plan.opened(ids, tok)  # a primed call's opening: the answer's start
        if len(ids) >= max_len:
            raise context_length_error(max_len, len(ids))
        check_plan(plan, tok)  # compiled above (or before): a lookup in the compile cache
        return ids

    work = prompt_work(chars, len(body.messages))
    prompt_ids = await state.prompts.run(rt.tenant_id, work, build, limit=limit)
    settings = request.app[SETTINGS]
    max_tokens = resolve_max_tokens(
        body, rt, len(prompt_ids), max_len, settings.model.default_max_tokens
    )
    obs.set_max_tokens(max_tokens)
    if not body.stream:
        check_logprobs_size(body.num_choices, max_tokens, body.num_logprobs)
    params = sampling_params(body, max_tokens, settings.model, tok.vocab_size)
    if plan.grammar is not None:
        params = dataclasses.replace(params, grammar=plan.grammar)
    return Prepared(prompt_ids, params, shared_prefix(prompt_ids, entry.prefix), plan)


def resolve_max_tokens(
    body: ChatRequest, rt: TenantRuntime, n_prompt: int, max_model_len: int, default: int
) -> int:
    cap = rt.limits.max_output_tokens or default
    room = max_model_len - n_prompt
    if room < 1:
        raise context_length_error(max_model_len, n_prompt)
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


def request_scopes(request: web.Request, principal: Principal) -> tuple[Scope, ...]:
    rl = request.app[SETTINGS].ratelimit
    defaults = VisitorDefaults(rl.visitor_rpm, rl.visitor_tpm, rl.visitor_max_concurrency)
    return admission_scopes(
        principal.runtime,
        principal.identity,
        principal.end_user_id,
        request_visitor(request, request.app[SETTINGS].ratelimit),
        defaults,
    )


async def admit(state: GatewayState, lease: Lease, obs: RequestObserver) -> Decision:
    with obs.child("gen_ai.rate_limit"):
        decision = await state.limiter.acquire(lease)
    if decision.allowed:
        return decision
    obs.rejected(decision.reason or "unknown", decision.scope or "tenant")
    if decision.reason == REASON_TOO_WIDE:  # n above max_concurrency: never admissible
        limit = next(s.limits for s in lease.scopes if s.kind == decision.scope)
        raise too_wide_error(lease.slots, decision.scope or "tenant", limit.max_concurrency)
    raise rate_limit_error(decision)


@dataclass
class HeldLimits:
    """What an admitted request holds of its limits: its lease, grown by each later step's
    tokens (the gateway's tool loop: ``admit_step``), the one ``finally`` releases."""

    request: web.Request
    principal: Principal
    model: str
    lease: Lease

    async def admit_step(self, prompt_tokens: int, max_tokens: int) -> None:
        """Reserve a later step's prompt and most completion tokens from the budgets and the
        lease's TPM before it runs, or raise the refusal (429 / 503)."""
        request, tokens = self.request, prompt_tokens + max_tokens
        await reserve_budget(request, self.principal, self.model, prompt_tokens, max_tokens)
        decision = await request.app[STATE].limiter.extend(self.lease, tokens)
        if decision.lease is None:
            metrics = request.app[TELEMETRY].metrics
            reason, scope = decision.reason or "unknown", decision.scope or "tenant"
            metrics.ratelimit_rejections.labels(self.lease.tenant, reason, scope).inc()
            raise rate_limit_error(decision)
        self.lease = decision.lease


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
