"""A new prompt version from the admin API: carried fields, checks off the event loop, the write.

    PUT /v1/tenants/{id}/system-prompt  {text, tools?, tool_choice?, max_tool_rounds?}
        -> {version, webhook_secret?}; omitted tools / options: the active version's
           (tenants/carry.py; the audit row names what was carried and from which version)

A prompt of up to 200,000 characters costs ~0.1-0.3 s of CPU to render and tokenize, and the
event loop serves every tenant: so the heavy part of a write runs as one job on the tokenize pool
(gateway/prompts/tokenize_pool.py: a worker thread at nice 19, in the tenant's turn, within its
bounds): the tools' checks (their parameters' JSON Schemas against the meta-schema) and the whole
prefix (text and tools through the chat template) counted against the prompt limit. The pin manager
builds the new prefix the same way after the write (gateway/prompts/pins.py). What stays on the
loop per write: decoding the JSON body, one read, one write transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from aiohttp import web

from gateway.admin.context import ADMIN_CONTEXT, PromptLimit
from gateway.context import STATE
from gateway.prompts.tokenize_pool import COMPILE_WORK, prompt_work
from tenants.carry import ActiveVersion, Carry, prepare_version
from tenants.errors import PromptTooLong
from tenants.runtime import ToolPolicy
from tenants.schemas import PromptSet
from tenants.tool_service import ToolStore
from tenants.tools import runtime_tools, stored_tools

T = TypeVar("T")


async def off_loop(request: web.Request, tenant_id: str, work: int, fn: Callable[[], T]) -> T:
    """``fn()`` on the gateway's tokenize pool (inline when ``work`` is small, as the pool
    decides; without a running gateway, the admin app alone, inline: no pool, no tokenizer)."""
    state = request.config_dict.get(STATE)
    if state is None:
        return fn()
    return await state.prompts.run(tenant_id, work, fn)


def check_tokens(limit: PromptLimit | None, text: str, tools: ToolPolicy, param: str) -> None:
    """The version's prefix within the limit, else 422 ``prompt_too_long``: ``param`` when the
    text alone is too long, ``tools`` when only text and tools together are. Tokenizes."""
    if limit is None:
        return
    num_tokens, max_tokens = limit.count(text, tools), limit.max_tokens()
    if num_tokens <= max_tokens:
        return
    alone = limit.count(text, ToolPolicy()) if tools.tools else num_tokens
    raise PromptTooLong(num_tokens, max_tokens, param=param if alone > max_tokens else "tools")


async def check_prompt(request: web.Request, tenant_id: str, text: str, param: str) -> None:
    """A tenant's first prompt (no tools) within the limit, tokenized off the loop."""
    limit = request.app[ADMIN_CONTEXT].prompt_limit
    work = prompt_work(len(text), 1)
    await off_loop(request, tenant_id, work, lambda: check_tokens(limit, text, ToolPolicy(), param))


def _checked(
    raw: Any, active: ActiveVersion, limit: PromptLimit | None
) -> tuple[PromptSet, Carry | None]:
    data, carry = prepare_version(raw, active)
    policy = ToolPolicy(tools=runtime_tools(stored_tools(data.tools or [])))
    check_tokens(limit, data.text, policy, "text")
    return data, carry


async def put_version(request: web.Request, raw: Any) -> web.Response:
    """PUT .../system-prompt with its decoded body: the active version read (404 for an unknown
    tenant), the merged version checked off the loop, then written."""
    ctx = request.app[ADMIN_CONTEXT]
    tenant_id = request.match_info["id"]
    store = ToolStore(ctx.store)
    active = await store.active_version(tenant_id)
    # With tools, always a thread: their schemas are checked, like a grammar's compile.
    work = prompt_work(_text_chars(raw), 1)
    if _has_tools(raw, active):
        work = max(work, COMPILE_WORK)
    limit = ctx.prompt_limit
    data, carry = await off_loop(request, tenant_id, work, lambda: _checked(raw, active, limit))
    out = await store.set_prompt(tenant_id, data, actor=ctx.actor, carry=carry)
    return web.json_response(out.model_dump(mode="json", exclude_none=True))


def _text_chars(raw: Any) -> int:
    text = raw.get("text") if isinstance(raw, dict) else None
    return len(text) if isinstance(text, str) else 0


def _has_tools(raw: Any, active: ActiveVersion) -> bool:
    """Whether the version will have tools to check (then always on a thread: their schemas)."""
    sent = raw.get("tools") if isinstance(raw, dict) else None
    return bool(sent) or (isinstance(raw, dict) and "tools" not in raw and bool(active.tools))
