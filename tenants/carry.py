"""A new prompt version carries forward what its body omits.

    PUT .../system-prompt {text}                     tools, tool_choice, max_tool_rounds: the
                                                     active version's, as stored
    PUT .../system-prompt {text, tools: []}          no tools (null too: the default)
    PUT .../system-prompt {text, tools: [...]}       those tools; the omitted options carried

Each of ``tools``, ``tool_choice`` and ``max_tool_rounds`` is carried on its own when it is
absent from the body (a field sent as null is sent: it asks for the default). The merged body is
then checked as if it had been sent whole, so a carried ``tool_choice`` that names a tool the new
``tools`` lack is a 400 on ``tool_choice``, its message saying it was carried.

The active version is read before the new one is checked (the check tokenizes, off the event
loop, outside any transaction); the write then requires that version to still be the active
one (``Carry.from_version``), else ``PromptChanged`` (409): a version made meanwhile by another
writer is never silently overwritten by what this one carried from its predecessor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from tenants.errors import InvalidField, PromptChanged, TenantNotFound
from tenants.models import SystemPrompt, Tenant
from tenants.schemas import PromptSet, parse
from tenants.tools import InvalidTools, parse_options, parse_tools

CARRIED = ("tools", "tool_choice", "max_tool_rounds")


@dataclass(frozen=True)
class ActiveVersion:
    """What a new version may carry: the active version's tools and options as stored (all
    None when the tenant has no active version)."""

    version: int | None
    tools: list[dict[str, Any]] | None = None
    options: dict[str, Any] | None = None


@dataclass(frozen=True)
class Carry:
    """The fields a new version's body omitted, taken from ``from_version`` (None: the tenant
    had no version to take them from: defaults); the write checks that ``from_version`` is
    still the active one."""

    from_version: int | None
    fields: tuple[str, ...]

    def audit(self) -> dict[str, Any]:
        """What the audit row of the new version says about it (nothing when nothing was)."""
        if self.from_version is None:
            return {}
        return {"carried_from": self.from_version, "carried": list(self.fields)}

    def check(self, tenant_id: str, active: int | None) -> None:
        if active != self.from_version:
            raise PromptChanged(tenant_id, self.from_version, active)


async def read_active_version(session: AsyncSession, tenant_id: str) -> ActiveVersion:
    tenant = await session.get(Tenant, tenant_id)
    if tenant is None:
        raise TenantNotFound(tenant_id)
    version = tenant.active_prompt_version
    row = await session.get(SystemPrompt, (tenant_id, version)) if version is not None else None
    if row is None:
        return ActiveVersion(None)
    return ActiveVersion(version, row.tools, row.tool_options)


def prepare_version(raw: Any, active: ActiveVersion) -> tuple[PromptSet, Carry | None]:
    """The body of set-prompt with the omitted fields filled from ``active``, checked whole:
    tools first (``InvalidTools``: 400s, the JSON Schemas of their parameters included), then
    the options against them, then the rest. CPU-bound for large tools (the gateway runs it on
    its tokenize threads)."""
    if not isinstance(raw, dict):
        raise InvalidField("body: must be a JSON object")
    omitted = tuple(name for name in CARRIED if name not in raw)
    carry = Carry(active.version, omitted) if omitted else None
    stored: dict[str, Any] = {"tools": active.tools, **(active.options or {})}
    merged = {**raw, **{name: stored[name] for name in omitted if name in stored}}
    merged = {k: v for k, v in merged.items() if v is not None or k not in CARRIED}  # defaults
    try:
        tools = parse_tools(merged.get("tools"))
        parse_options(merged, {t.function.name for t in tools})
    except InvalidTools as exc:
        raise _said_carried(exc, carry) from None
    return parse(PromptSet, merged), carry


def _said_carried(exc: InvalidTools, carry: Carry | None) -> InvalidTools:
    """``exc``, its message naming the version a carried field came from."""
    root = (exc.param or "").split(".", 1)[0]
    if carry is None or carry.from_version is None or root not in carry.fields:
        return exc
    note = f" ({root} was carried from version {carry.from_version}: send it to change it)"
    return InvalidTools(f"{exc}{note}", param=exc.param)
