"""API keys: generation, hashing, parsing, and batched ``last_used_at`` updates.

Key layout: ``kvg_<prefix>_<secret>``; ``prefix`` is 12 hex chars (public, unique, used for the
lookup), ``secret`` 43 url-safe chars (256 bits). The database holds the prefix and the SHA-256
of the whole key string; the key itself is returned once at creation and never stored or logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime

import structlog
from sqlalchemy import bindparam, or_, update

from tenants.db import SessionFactory, is_unavailable
from tenants.models import ApiKey, utcnow

log = structlog.get_logger(__name__)

KEY_RE = re.compile(r"^kvg_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")


@dataclass(frozen=True)
class NewKey:
    id: str
    prefix: str
    key: str  # shown once
    secret_sha256: str

    def __repr__(self) -> str:  # never print the key
        return f"NewKey(id={self.id!r}, prefix={self.prefix!r})"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def generate_key() -> NewKey:
    prefix = secrets.token_hex(6)
    key = f"kvg_{prefix}_{secrets.token_urlsafe(32)}"
    return NewKey(
        id=f"key_{secrets.token_hex(8)}", prefix=prefix, key=key, secret_sha256=hash_key(key)
    )


def key_prefix(key: str) -> str | None:
    """The public prefix of a well-formed key, else None."""
    m = KEY_RE.fullmatch(key)
    return m.group(1) if m else None


def key_matches(key: str, secret_sha256: str) -> bool:
    """Constant-time comparison of a presented key against a stored hash."""
    return hmac.compare_digest(hash_key(key).encode(), secret_sha256.encode())


class LastUsedRecorder:
    """Remembers the latest use of each key in memory; ``flush`` writes them in one transaction.

    Requests call ``record`` (no I/O). A periodic task (``start``) flushes; ``aclose`` flushes
    what is left. The UPDATE only moves ``last_used_at`` forward, so replicas flushing out of
    order never move it back.
    """

    def __init__(self) -> None:
        self._pending: dict[str, datetime] = {}
        self._task: asyncio.Task[None] | None = None

    def record(self, key_id: str, at: datetime | None = None) -> None:
        at = at or utcnow()
        prev = self._pending.get(key_id)
        if prev is None or at > prev:
            self._pending[key_id] = at

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def flush(self, sessions: SessionFactory) -> int:
        """Write pending timestamps; on failure they are kept for the next flush."""
        if not self._pending:
            return 0
        batch, self._pending = self._pending, {}
        stmt = (
            update(ApiKey)
            .where(ApiKey.id == bindparam("kid"))
            .where(or_(ApiKey.last_used_at.is_(None), ApiKey.last_used_at < bindparam("at")))
            .values(last_used_at=bindparam("at"))
            .execution_options(synchronize_session=False)
        )
        rows = [{"kid": k, "at": at} for k, at in batch.items()]
        try:
            async with sessions() as session, session.begin():
                conn = await session.connection()
                await conn.execute(stmt, rows)
        except Exception:
            for k, at in batch.items():
                self.record(k, at)
            raise
        return len(rows)

    def start(self, sessions: SessionFactory, interval_s: float) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(sessions, interval_s))

    async def _run(self, sessions: SessionFactory, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.flush(sessions)
            except Exception as exc:
                log.warning(
                    "key_last_used_flush_failed",
                    error=type(exc).__name__,
                    unavailable=is_unavailable(exc),
                )

    async def aclose(self, sessions: SessionFactory) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.flush(sessions)

    def check_integrity(self) -> None:
        for key_id, at in self._pending.items():
            assert at.tzinfo is not None, f"naive timestamp pending for {key_id}"
