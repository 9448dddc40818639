"""What issuing a session token costs: a per-key rate limit, and no database write per token.

Each server key may issue ``KVGATE_WIDGET_SESSION_RPM`` tokens a minute, through the shared
limiter in a bucket of its own::

    lease tenant (Redis hash tag)   "<tenant id>:sessions"    (a tenant id holds no ':', so this
                                                              never meets the tenant's chat scopes)
    scopes                          tenant-kind scope, unlimited (the limiter's required first)
                                    key scope of the issuing key: RPM = the setting

A refusal is the chat API's 429 (``Retry-After``, ``x-ratelimit-*``, scope ``key``). The secret
is the tenant's cached one (``TenantRuntime.widget.session_secret``); only a tenant that has
none yet writes, once (tenants/widget.py: a conditional insert, race-safe across replicas).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gateway.access.auth import Principal
from gateway.chat.admission import rate_limit_error
from gateway.context import GatewayState
from gateway.ratelimit import SCOPE_KEY, SCOPE_TENANT, Decision, Lease, Limits, Scope
from tenants.runtime import TenantRuntime
from tenants.widget import WidgetStore

BUCKET_SUFFIX = ":sessions"


def issuance_lease(principal: Principal, rpm: int) -> Lease:
    bucket = principal.runtime.tenant_id + BUCKET_SUFFIX
    scopes = (
        Scope(SCOPE_TENANT, bucket, Limits()),
        Scope(SCOPE_KEY, principal.identity.key_id, Limits(rpm=rpm)),
    )
    return Lease.new(bucket, scopes, 0)


@asynccontextmanager
async def admitted(state: GatewayState, principal: Principal, rpm: int) -> AsyncIterator[Decision]:
    """Admit one issuance (429 beyond the key's rate); the lease is given back on exit."""
    lease = issuance_lease(principal, rpm)
    try:
        decision = await state.limiter.acquire(lease)
        if not decision.allowed:
            raise rate_limit_error(decision)
        yield decision
    finally:
        await asyncio.shield(state.limiter.release(lease, 0))


async def session_secret(state: GatewayState, rt: TenantRuntime) -> str:
    """The tenant's secret from its cached runtime; created (one write) only if it has none."""
    if rt.widget.session_secret is not None:
        return rt.widget.session_secret
    return await WidgetStore(state.store).session_secret(rt.tenant_id, actor="gateway")
