"""The database side of sealed secrets: which keys sealed what, the start-up key check, and
resealing everything under a new key.

Invariant: every key that sealed a value stored in ``tenants.tool_secret`` or
``mcp_servers.bearer`` has its row in ``secret_keys`` (fingerprint, a probe sealed under it).
``seal`` adds the sealing key's row in the transaction that stores the value, before it; only
``reseal_all`` removes rows, after it resealed every value under the first key. So:

    start-up (``check_key``)   the table is empty: this key's row is added (the first gateway
                               claims the database for its key); else every row's probe must
                               open with a key of the ring, or start-up fails naming the
                               missing fingerprints: a gateway never starts with a key that
                               would read the stored secrets as garbage or not at all
    rotation (``reseal_all``)  one transaction: each value resealed under the first key, then
                               the other keys' rows deleted

Writers of ``secret_keys`` serialize: ``_lock`` (PostgreSQL: a table lock in SHARE ROW EXCLUSIVE
mode, which conflicts with itself and with the row-exclusive lock of ``seal``'s insert; SQLite:
a first statement that writes, taking the database's write lock). A seal that committed before a
rotation took the lock is resealed by it; one after re-adds its key's row.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy import delete, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import InstrumentedAttribute

from tenants.models import McpServer, SecretKey, Tenant, utcnow
from tenants.sealing import PROBE, SecretBox, SecretsKeyError, SecretUnreadable
from tenants.secret_keys import SecretsSettings, load_box

T = TypeVar("T")
Write = Callable[[Callable[[AsyncSession], Awaitable[T]]], Awaitable[T]]


def _postgres(session: AsyncSession) -> bool:
    return session.get_bind().dialect.name == "postgresql"


async def note_key(session: AsyncSession, box: SecretBox) -> None:
    """The sealing key's row (added if missing)."""
    insert = postgresql.insert if _postgres(session) else sqlite.insert
    row = {"fingerprint": box.current, "probe": box.seal(PROBE), "created_at": utcnow()}
    stmt = insert(SecretKey).values(row).on_conflict_do_nothing(index_elements=["fingerprint"])
    await session.execute(stmt)


async def seal(session: AsyncSession, box: SecretBox, clear: str) -> str:
    """``clear`` sealed for storing in this transaction."""
    await note_key(session, box)
    return box.seal(clear)


async def _lock(session: AsyncSession) -> None:
    if _postgres(session):
        await session.execute(text("LOCK TABLE secret_keys IN SHARE ROW EXCLUSIVE MODE"))
    else:
        no_row = SecretKey.fingerprint != SecretKey.fingerprint
        await session.execute(update(SecretKey).where(no_row).values(probe=SecretKey.probe))


async def keys_missing(session: AsyncSession, box: SecretBox) -> list[str]:
    """Fingerprints of the database's keys that ``box`` does not hold."""
    rows = (await session.scalars(select(SecretKey))).all()
    return sorted(r.fingerprint for r in rows if not box.opens(r.fingerprint, r.probe))


async def check_key(session: AsyncSession, box: SecretBox) -> None:
    """Start-up: claim an empty table for ``box``'s key, else require every listed key."""
    await _lock(session)
    if await session.scalar(select(SecretKey.fingerprint).limit(1)) is None:
        await note_key(session, box)
        return
    missing = await keys_missing(session, box)
    if missing:
        raise SecretsKeyError(
            f"this database's secrets are sealed under key {', '.join(missing)}, which the "
            f"given keys ({', '.join(box.fingerprints)}) do not include: set the key every "
            "gateway of this database uses (while rotating, the old keys after the new one; "
            "docs/operations.md)"
        )


@dataclass(frozen=True)
class Resealed:
    tool_secrets: int
    bearers: int
    keys_dropped: int


async def reseal_all(session: AsyncSession, box: SecretBox) -> Resealed:
    """Every stored secret sealed again under the first key; the other keys' rows removed.
    A value no key opens fails it all (``SecretUnreadable`` naming its row; nothing written)."""
    await _lock(session)
    tools = await _reseal_column(session, box, Tenant.id, Tenant.tool_secret, "tenant")
    bearers = await _reseal_column(session, box, McpServer.id, McpServer.bearer, "MCP server")
    gone = await session.execute(delete(SecretKey).where(SecretKey.fingerprint != box.current))
    await note_key(session, box)
    return Resealed(tools, bearers, int(getattr(gone, "rowcount", 0) or 0))


async def _reseal_column(
    session: AsyncSession,
    box: SecretBox,
    key: InstrumentedAttribute[str],
    column: InstrumentedAttribute[str | None],
    what: str,
) -> int:
    """Reseal every value of ``column``; how many there were."""
    rows = (await session.execute(select(key, column).where(column.is_not(None)))).all()
    for row_id, stored in rows:
        assert stored is not None  # the query's condition
        try:
            new = box.reseal(stored)
        except SecretUnreadable as exc:
            raise SecretUnreadable(f"{what} {row_id!r}, {column.key}: {exc}") from None
        stmt = update(column.class_).where(key == row_id).values({column.key: new})
        await session.execute(stmt)
    return len(rows)


class SecretKeeper:
    """The tenant store's secrets key: loaded (key file work on a thread) and checked against
    the database once, at its first use; the gateway makes that use at start-up, so a missing
    or wrong key fails the start."""

    def __init__(self, settings: SecretsSettings | None, write: Write[None]) -> None:
        self._settings = settings
        self._write = write
        self._box: SecretBox | None = None
        self._lock = asyncio.Lock()

    async def box(self) -> SecretBox:
        if self._box is not None:
            return self._box
        async with self._lock:
            if self._box is None:
                if self._settings is None:
                    raise SecretsKeyError("this tenant store was opened without a secrets key")
                box = await asyncio.to_thread(load_box, self._settings)
                await self._write(lambda s: check_key(s, box))
                self._box = box
            return self._box
