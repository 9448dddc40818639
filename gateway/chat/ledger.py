"""The chat handler's one call into the usage ledger: a record per authenticated request.

Called from gateway/chat/views.py after the observer closed the request (its status is final:
answered, refused, cancelled by the client, cut at shutdown), and for refusals between the key
check and the observer (a bad body after a good key). Builds the record from what the observer
and the principal already hold; nothing here waits (gateway/usage/recorder.py).
"""

from __future__ import annotations

import hashlib
import time

from aiohttp import web

from gateway.access.auth import Principal
from gateway.access.visitor import request_visitor
from gateway.chat.observe import RequestObserver
from gateway.chat.schemas import ChatRequest
from gateway.context import SETTINGS
from gateway.usage.budgets import Reservation
from gateway.usage.ledger import LEDGER
from gateway.usage.record import UsageRecord, outcome_of
from tenants.usage_models import END_USER_MAX

PROMPT_VERSION = web.RequestKey("prompt_version", int)
TOOL_CALLS = web.RequestKey("tool_calls", int)  # tenant tool calls the gateway ran
BUDGET = web.RequestKey("budget_reservations", list[Reservation])  # one per engine step


async def reserve_budget(
    request: web.Request, principal: Principal, model: str, prompt: int, completion_max: int
) -> None:
    """Admission of one engine step against the tenant's and key's budgets (429
    ``budget_exceeded`` / 503), with a reservation of the step's most tokens and spend; the
    request's reservations are settled together by ``record_chat``. A budget admits while it is
    not yet spent, so concurrent requests end at most one step's reservation over it."""
    ledger = request.app.get(LEDGER)
    if ledger is None or ledger.budgets is None:
        return
    spend = ledger.spend(model, prompt, 0, completion_max)
    rt = principal.runtime
    res = await ledger.budgets.reserve(
        rt.tenant_id, principal.identity.key_id, prompt + completion_max, spend
    )
    if res is not None:
        request.setdefault(BUDGET, []).append(res)


def shares(reserved: list[int], used: int) -> list[int]:
    """``used`` split over reservations in order, each up to what it reserved, the rest on the
    last: what each reservation settles with (their sum is ``used``)."""
    out, left = [], used
    for i, r in enumerate(reserved):
        take = left if i == len(reserved) - 1 else min(r, left)
        out.append(take)
        left -= take
    return out


def end_user_of(request: web.Request, principal: Principal, user: str | None) -> str | None:
    """The session's end user; a widget visitor without one as ``visitor:<hash of its visitor
    address>`` (gateway/access/visitor.py; the browser's ``user`` is not trusted, as for the cache
    scope); a server key's ``user``."""
    if principal.end_user_id is not None:
        return principal.end_user_id[:END_USER_MAX]
    if principal.is_widget:
        addr = request_visitor(request, request.app[SETTINGS].ratelimit)
        return "visitor:" + hashlib.blake2b(addr.encode(), digest_size=8).hexdigest()
    return user[:END_USER_MAX] if user else None


def _at_us(started: float) -> int:
    return time.time_ns() // 1000 - int((time.monotonic() - started) * 1_000_000)


def record_chat(
    request: web.Request,
    principal: Principal,
    body: ChatRequest,
    obs: RequestObserver,
    error: str | None,
) -> None:
    ledger = request.app.get(LEDGER)
    if ledger is None:
        return
    s = obs.stats
    status = obs.status
    if obs.cut_by_shutdown:
        error = "server_shutdown"
    prompt, cached, completion = (0, 0, 0)
    if s is not None:
        prompt, cached, completion = s.prompt_tokens, s.cached_tokens, s.completion_tokens
    ttft = s.first_token_at - obs.started if s and s.first_token_at is not None else None
    spend = ledger.spend(body.model, prompt, cached, completion)
    held = request.get(BUDGET, [])
    tokens = shares([r.tokens for r in held], prompt + completion)
    spends = shares([r.spend for r in held], spend)
    for res, t, sp in zip(held, tokens, spends, strict=True):
        ledger.settle(res, t, sp)
    ledger.record(
        UsageRecord(
            request_id=obs.request_id,
            at_us=_at_us(obs.started),
            tenant_id=obs.tenant_id,
            key_id=principal.identity.key_id,
            end_user=end_user_of(request, principal, body.user),
            model=body.model,
            prompt_tokens=prompt,
            cached_tokens=cached,
            completion_tokens=completion,
            choices=body.num_choices,
            stream=body.stream,
            status=status,
            outcome=outcome_of(status, error),
            error=error[:64] if error else None,
            finish_reason=s.finish_reason if s else None,
            ttft_ms=round(ttft * 1000, 3) if ttft is not None else None,
            duration_ms=round((time.monotonic() - obs.started) * 1000, 3),
            worker=s.worker if s else None,
            prompt_version=request.get(PROMPT_VERSION),
            tool_calls=request.get(TOOL_CALLS, 0),
            spend_nanos=spend,
        )
    )


def record_refusal(
    request: web.Request,
    principal: Principal | None,
    request_id: str,
    started: float,
    status: int,
    error: str | None,
) -> None:
    """A request refused after its key was accepted and before its body was read in full."""
    ledger = request.app.get(LEDGER)
    if ledger is None or principal is None:
        return
    ledger.record(
        UsageRecord(
            request_id=request_id,
            at_us=_at_us(started),
            tenant_id=principal.runtime.tenant_id,
            key_id=principal.identity.key_id,
            end_user=end_user_of(request, principal, None),
            model="",
            status=status,
            outcome=outcome_of(status, error),
            error=error[:64] if error else None,
            duration_ms=round((time.monotonic() - started) * 1000, 3),
        )
    )
