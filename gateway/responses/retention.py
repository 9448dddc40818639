"""The retention purge of stored conversations and responses, every ``KVGATE_CONVERSATION_
PURGE_S`` while the gateway runs (each tenant's ``conversation_retention_days``, else
``KVGATE_CONVERSATION_RETENTION_DAYS``). Every replica runs it; the deletes are idempotent."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import structlog
from aiohttp import web

from gateway.context import SETTINGS, STATE
from tenants.conversation_records import Purged
from tenants.conversation_store import ConversationStore
from tenants.errors import TenantStoreError
from tenants.models import utcnow

log = structlog.get_logger("gateway.conversations")


async def purge_once(app: web.Application) -> Purged:
    days = app[SETTINGS].conversations.retention_days
    purged = await ConversationStore(app[STATE].store).purge_expired(utcnow(), days)
    if purged.conversations or purged.responses:
        log.info(
            "conversations_purged",
            conversations=purged.conversations,
            responses=purged.responses,
            items=purged.items,
        )
    return purged


async def _loop(app: web.Application, interval_s: float) -> None:
    while True:
        try:
            await purge_once(app)
        except (TenantStoreError, OSError) as exc:  # the database is out: next round
            log.warning("conversations_purge_failed", error=type(exc).__name__)
        await asyncio.sleep(interval_s)


async def conversation_purge(app: web.Application) -> AsyncIterator[None]:
    """``cleanup_ctx``: the purge loop from start-up to shutdown."""
    task = asyncio.create_task(_loop(app, app[SETTINGS].conversations.purge_s))
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
