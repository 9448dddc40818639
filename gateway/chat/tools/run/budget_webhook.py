"""A budget's soft-threshold webhook: one signed JSON POST per crossing, off the request path.

    POST <budget.soft_webhook>
    Content-Type: application/json
    X-Kvgate-Timestamp: <Unix seconds>
    X-Kvgate-Signature: v1=<hex HMAC-SHA256(tenant tool secret, "<timestamp>.<body>")>
    X-Kvgate-Tenant: acme    X-Kvgate-Event: budget.soft_threshold

    {"event": "budget.soft_threshold", "tenant_id", "key_id", "period", "what": "tokens"|"spend",
     "used", "limit", "soft_threshold", "at"}

Signed exactly as tenant tool webhooks are (gateway/chat/tools/run/webhook.py ``signature``, the
tenant's tool secret; docs/tools.md shows a receiver), sent through the tools' egress (its
allowlist and address checks). One try: a failure is logged (``budget_webhook_failed``) and
counted, never retried and never in the way of a request.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime

import structlog
from prometheus_client import CollectorRegistry, Counter

from gateway.chat.tools.run.egress import Egress
from gateway.chat.tools.run.runner import SecretLookup
from gateway.chat.tools.run.webhook import SIGNATURE_HEADER, TIMESTAMP_HEADER, signature
from gateway.usage.budgets import SoftCrossing

log = structlog.get_logger("gateway.usage")

EVENT = "budget.soft_threshold"


def event_body(c: SoftCrossing) -> bytes:
    d = c.budget
    doc = {
        "event": EVENT,
        "tenant_id": d.tenant_id,
        "key_id": d.key_id or None,
        "period": d.period,
        "what": c.what,
        "used": c.used,
        "limit": c.limit,
        "soft_threshold": d.soft_fraction,
        "at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
    }
    return json.dumps(doc, separators=(",", ":")).encode()


class SoftWebhooks:
    def __init__(
        self, egress: Egress, secret: SecretLookup, registry: CollectorRegistry | None = None
    ) -> None:
        self.egress = egress
        self.secret = secret
        self.sent = Counter(
            "kvgate_budget_webhook_calls",
            "budget soft-threshold webhook calls (result: ok | failed | no_secret)",
            ["result"],
            registry=registry,
        )
        self._tasks: set[asyncio.Task[None]] = set()

    def __call__(self, c: SoftCrossing) -> None:
        if c.budget.soft_webhook is None:
            return
        task = asyncio.create_task(self._send(c, c.budget.soft_webhook))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, c: SoftCrossing, url: str) -> None:
        tenant = c.budget.tenant_id
        try:
            secret = await self.secret(tenant)
            if secret is None:
                self.sent.labels("no_secret").inc()
                log.warning("budget_webhook_failed", tenant=tenant, error="no_signing_secret")
                return
            body = event_body(c)
            ts = int(time.time())
            headers = {
                "Content-Type": "application/json",
                TIMESTAMP_HEADER: str(ts),
                SIGNATURE_HEADER: signature(secret, ts, body),
                "X-Kvgate-Tenant": tenant,
                "X-Kvgate-Event": EVENT,
                "User-Agent": "kvgate-budgets/1",
            }
            reply = await self.egress.post(url, body, headers)
            if not 200 <= reply.status < 300:
                raise RuntimeError(f"status {reply.status}")
        except Exception as exc:
            self.sent.labels("failed").inc()
            log.warning("budget_webhook_failed", tenant=tenant, error=str(exc)[:200])
            return
        self.sent.labels("ok").inc()

    async def close(self) -> None:
        """Wait (briefly) for calls in flight."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=2.0)
