"""Public widget routes: the script, the config a widget key reads, end-user sessions.

GET  /widget/v1/kvgate-chat.js     the widget (ETag, 304, long cache, CORS *)
GET  /widget/v1/config?key=K       title, greeting, accent, require_session, history (never
                                   secrets)
POST /v1/widget/sessions           server key; {end_user_id, origin, ttl_s} -> session token
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.access import session_tokens
from gateway.context import SETTINGS, STATE
from gateway.errors import ApiError
from gateway.widget import issuance
from gateway.widget.body import read_json
from tenants.schemas import ORIGIN_RE, parse

SCRIPT_PATH = Path(__file__).parent / "static" / "kvgate-chat.js"
SCRIPT_CACHE = "public, max-age=86400, stale-while-revalidate=604800"


@dataclass(frozen=True)
class Asset:
    body: bytes
    etag: str
    content_type: str

    @classmethod
    def load(cls, path: Path, content_type: str) -> Asset:
        body = path.read_bytes()
        return cls(body, f'"{hashlib.sha256(body).hexdigest()[:32]}"', content_type)

    async def serve(self, request: web.Request) -> web.Response:
        headers = {"ETag": self.etag, "Cache-Control": SCRIPT_CACHE}
        wanted = request.headers.get("If-None-Match", "")
        if self.etag in (tag.strip() for tag in wanted.split(",")) or wanted.strip() == "*":
            return web.Response(status=304, headers=headers)
        return web.Response(body=self.body, headers={**headers, "Content-Type": self.content_type})


def _forbidden(message: str, code: str) -> ApiError:
    return ApiError(403, message, type_="permission_error", code=code)


async def widget_config(request: web.Request) -> web.Response:
    """What a widget key's page shows. Refuses (readably: CORS *) pages whose origin the key
    does not allow, so the widget can say why it cannot chat. A server key gets exactly the
    answer an unknown key gets: this public route must not tell anyone which keys are valid."""
    state = request.app[STATE]
    key = request.query.get("key", "")
    ident = await state.keys.identity(key) if key else None
    if ident is None or ident.kind != "widget":
        raise ApiError(
            401, "invalid widget key", type_="authentication_error", code="invalid_api_key"
        )
    origin = request.headers.get("Origin")
    if origin is not None and origin not in ident.allowed_origins:
        raise _forbidden(f"this widget key is not allowed from {origin}", "origin_not_allowed")
    rt = await state.keys.runtime(ident.tenant_id)
    if rt is None or rt.status != "active":
        raise _forbidden("this chat is not available", "tenant_unavailable")
    widget = rt.widget  # the cached runtime: no database read per page view
    body = {
        "title": widget.title,
        "greeting": widget.greeting,
        "accent": widget.accent,
        "require_session": widget.require_session,
        "history": widget.history and rt.conversations.store,
        "model": state.model_name,
    }
    return web.json_response(body, headers={"Cache-Control": "no-cache"})


class SessionIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    end_user_id: str = Field(min_length=1, max_length=200)
    origin: str
    ttl_s: int = Field(default=900, ge=1, le=session_tokens.MAX_TTL_S)

    @field_validator("origin")
    @classmethod
    def _origin(cls, value: str) -> str:
        if not ORIGIN_RE.fullmatch(value):
            raise ValueError("must be an origin like https://example.com")
        return value

    @field_validator("end_user_id")
    @classmethod
    def _printable(cls, value: str) -> str:
        if not value.isprintable():
            raise ValueError("must be printable text")
        return value


async def create_session(request: web.Request) -> web.Response:
    """A session token for one end user on one origin, signed with the tenant's secret
    (created on first use). Only server keys may ask: this call belongs on the tenant's backend.
    Rate-limited per key; no database write per token (gateway/widget/issuance.py)."""
    state = request.app[STATE]
    principal = await state.keys.authenticate(request)
    if principal.is_widget:
        raise _forbidden("session tokens are issued to server keys only", "server_key_required")
    rpm = request.app[SETTINGS].widget.session_rpm
    async with issuance.admitted(state, principal, rpm) as decision:
        data = parse(SessionIn, await read_json(request))
        secret = await issuance.session_secret(state, principal.runtime)
    tenant_id = principal.runtime.tenant_id
    expires_at = int(time.time()) + data.ttl_s
    claims = session_tokens.SessionClaims(
        tenant_id, principal.identity.key_id, data.origin, data.end_user_id, expires_at
    )
    body = {
        "token": session_tokens.sign(claims, secret),
        "expires_at": expires_at,
        "expires_in": data.ttl_s,
        "origin": data.origin,
        "end_user_id": data.end_user_id,
    }
    headers = {**decision.headers(), "Cache-Control": "no-store"}
    return web.json_response(body, status=201, headers=headers)
