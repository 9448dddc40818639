"""End-user session tokens: short-lived, HMAC-signed, bound to one origin. Issued to widget
pages (gateway/widget/views.py), checked with every other credential by gateway/access/auth.py.

    kvws_<payload>.<mac>      payload = base64url(JSON claims), mac = base64url(HMAC-SHA256)
    claims = {"t": tenant id, "k": issuing key id, "o": origin, "u": end user id, "e": expiry}
    mac    = HMAC-SHA256(tenant's widget_session_secret, "kvws1." + payload)

The tenant id is read before verification only to find the secret; nothing else is trusted until
the MAC matches (constant-time compare). Rotating the tenant's secret revokes every token.
Pure functions: no I/O, no clock of their own.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

from tenants.schemas import TENANT_ID_RE

PREFIX = "kvws_"
MAX_TTL_S = 3600
_DOMAIN = b"kvws1."  # versions the MAC input, so a future format cannot be confused with this one


class SessionTokenError(Exception):
    """A token that does not verify; ``expired`` tells an expired but authentic one apart."""

    def __init__(self, message: str, *, expired: bool = False) -> None:
        super().__init__(message)
        self.expired = expired


@dataclass(frozen=True)
class SessionClaims:
    tenant_id: str
    key_id: str  # the server key that issued the token
    origin: str
    end_user_id: str
    expires_at: int  # unix seconds


def is_session_token(secret: str) -> bool:
    return secret.startswith(PREFIX)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: str, payload: str) -> str:
    return _b64(hmac.new(secret.encode(), _DOMAIN + payload.encode(), hashlib.sha256).digest())


def sign(claims: SessionClaims, secret: str) -> str:
    body = {
        "t": claims.tenant_id,
        "k": claims.key_id,
        "o": claims.origin,
        "u": claims.end_user_id,
        "e": claims.expires_at,
    }
    payload = _b64(json.dumps(body, separators=(",", ":")).encode())
    return f"{PREFIX}{payload}.{_mac(secret, payload)}"


def _decode(token: str) -> tuple[str, str, dict[str, Any]]:
    if not is_session_token(token):
        raise SessionTokenError("not a session token")
    payload, dot, mac = token[len(PREFIX) :].partition(".")
    if not dot or not payload or not mac:
        raise SessionTokenError("malformed session token")
    try:
        data = json.loads(_unb64(payload))
    except (binascii.Error, ValueError, RecursionError):
        raise SessionTokenError("malformed session token") from None
    if not isinstance(data, dict):
        raise SessionTokenError("malformed session token")
    return payload, mac, data


def peek_tenant(token: str) -> str:
    """The tenant id a token claims (unverified: only to look up the secret)."""
    tenant = _decode(token)[2].get("t")
    # Checked before it reaches a query: no NUL or other bytes a tenant id cannot hold.
    if not isinstance(tenant, str) or not TENANT_ID_RE.fullmatch(tenant):
        raise SessionTokenError("malformed session token")
    return tenant


def verify(token: str, secret: str | None, now: float) -> SessionClaims:
    payload, mac, data = _decode(token)
    expected = None if secret is None else _mac(secret, payload).encode()
    if expected is None or not hmac.compare_digest(mac.encode(errors="replace"), expected):
        raise SessionTokenError("invalid session token")
    try:
        claims = SessionClaims(
            tenant_id=_text(data["t"]),
            key_id=_text(data["k"]),
            origin=_text(data["o"]),
            end_user_id=_text(data["u"]),
            expires_at=_int(data["e"]),
        )
    except (KeyError, TypeError):
        raise SessionTokenError("malformed session token") from None
    if claims.expires_at <= now:
        raise SessionTokenError("session token expired", expired=True)
    return claims


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("expected a string")
    return value


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError("expected an integer")
    return value
