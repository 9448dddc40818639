"""Webhook tools: a signed JSON POST of the call, Stripe/GitHub style (docs/tools.md).

    POST <source.webhook>
    Content-Type: application/json
    X-Kvgate-Timestamp: 1767225600                      (Unix seconds, when it was sent)
    X-Kvgate-Signature: v1=<hex HMAC-SHA256(secret, "<timestamp>.<body>")>
    X-Kvgate-Tenant: acme   X-Kvgate-Tool: lookup_order   X-Kvgate-Call-Id: call_...

    {"tool": "lookup_order", "call_id": "call_...", "arguments": {...}}

The secret is the tenant's own (tenants.tool_secret, shown once by the admin API); a receiver
recomputes the signature over the raw body and refuses a timestamp outside its replay window
(``REPLAY_WINDOW_S`` recommended). The answer must be JSON; it becomes the ``tool`` message.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any

TIMESTAMP_HEADER = "X-Kvgate-Timestamp"
SIGNATURE_HEADER = "X-Kvgate-Signature"
REPLAY_WINDOW_S = 300  # receivers should refuse timestamps further than this from their clock


def signature(secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"v1={mac.hexdigest()}"


def verify(
    secret: str, body: bytes, headers: Any, *, now: float | None = None, window_s: int = 300
) -> bool:
    """What a receiver does (also the tests' receiver): the signature matches and the timestamp
    is within the replay window."""
    try:
        ts = int(headers[TIMESTAMP_HEADER])
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - ts) > window_s:
        return False
    return hmac.compare_digest(signature(secret, ts, body), str(headers.get(SIGNATURE_HEADER)))


def request_body(tool: str, call_id: str, arguments: Any) -> bytes:
    doc = {"tool": tool, "call_id": call_id, "arguments": arguments}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def signed_headers(
    secret: str, tenant_id: str, tool: str, call_id: str, body: bytes
) -> dict[str, str]:
    ts = int(time.time())
    return {
        "Content-Type": "application/json",
        TIMESTAMP_HEADER: str(ts),
        SIGNATURE_HEADER: signature(secret, ts, body),
        "X-Kvgate-Tenant": tenant_id,
        "X-Kvgate-Tool": tool,
        "X-Kvgate-Call-Id": call_id,
        "User-Agent": "kvgate-tools/1",
    }
