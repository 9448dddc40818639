"""Which limits one chat request must fit in: the scopes of its admission.

    tenant    always: the tenant's limits
    key       when the API key has limits of its own (api_keys.rpm / tpm / max_concurrency)
    visitor   widget traffic (a widget key, or a session token's end user): per end user, else
              per client address; the tenant's visitor_* limits, else the gateway's defaults

The client address is the TCP peer, or, when the peer is a trusted proxy
(KVGATE_TRUSTED_PROXIES), the right-most X-Forwarded-For hop that is not a trusted proxy
itself. Visitor ids are hashed (an address or end-user id is never a Redis key in clear).
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.ratelimit.types import SCOPE_KEY, SCOPE_TENANT, SCOPE_VISITOR, Limits, Scope
from tenants.runtime import KeyIdentity, TenantRuntime

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
UNKNOWN_ADDRESS = "unknown"


@dataclass(frozen=True)
class VisitorDefaults:
    """Per-visitor limits for tenants that set none (KVGATE_VISITOR_*)."""

    rpm: int = 20
    tpm: int = 20_000
    max_concurrency: int = 2


def admission_scopes(
    rt: TenantRuntime,
    key: KeyIdentity,
    end_user_id: str | None,
    client_address: str,
    defaults: VisitorDefaults,
) -> tuple[Scope, ...]:
    lim = rt.limits
    scopes = [
        Scope(
            SCOPE_TENANT,
            rt.tenant_id,
            Limits(lim.rpm or 0, lim.tpm or 0, lim.max_concurrency or 0),
        )
    ]
    if (key.rpm, key.tpm, key.max_concurrency) != (None, None, None):
        own = Limits(key.rpm or 0, key.tpm or 0, key.max_concurrency or 0)
        scopes.append(Scope(SCOPE_KEY, key.key_id, own))
    if key.kind == "widget" or end_user_id is not None:
        who = f"user:{end_user_id}" if end_user_id is not None else f"addr:{client_address}"
        scopes.append(Scope(SCOPE_VISITOR, _digest(who), visitor_limits(rt, defaults)))
    return tuple(scopes)


def visitor_limits(rt: TenantRuntime, defaults: VisitorDefaults) -> Limits:
    own = rt.visitor_limits
    return Limits(
        defaults.rpm if own.rpm is None else own.rpm,
        defaults.tpm if own.tpm is None else own.tpm,
        defaults.max_concurrency if own.max_concurrency is None else own.max_concurrency,
    )


def client_address(
    peer: str | None, forwarded_for: str | None, trusted: Sequence[IPNetwork]
) -> str:
    """The client's address: the peer, unless the peer is a trusted proxy (then the right-most
    X-Forwarded-For entry that is not one)."""
    if peer is None:
        return UNKNOWN_ADDRESS
    if not forwarded_for or not _trusted(peer, trusted):
        return peer
    hops = [h.strip() for h in forwarded_for.split(",") if h.strip()]
    for hop in reversed(hops):
        if not _trusted(hop, trusted):
            return hop if _parse(hop) is not None else UNKNOWN_ADDRESS
    return hops[0] if hops else peer


def _trusted(address: str, trusted: Sequence[IPNetwork]) -> bool:
    ip = _parse(address)
    return ip is not None and any(ip in net for net in trusted)


def _parse(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(address)
    except ValueError:
        return None


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
