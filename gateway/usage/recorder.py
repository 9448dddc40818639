"""``Recorder``: usage records off the request path, through the spool, into the database.

    record(rec)   request path: one write to the spool's current segment + a list append
    every flush_s (or at batch_size records):
        batch = the records since the last tick; fsync their segment (a thread)
        healthy: apply the batch (gateway/usage/writer.py); a full segment whose batches all
                 landed is deleted
        database failed: the segment is marked for replay, the records stay on disk only
        segments marked for replay are read back and applied (oldest first, at most one try per
        retry_s while the database fails), then deleted

Memory stays bounded during an outage of any length: a batch that cannot be applied is dropped
from memory after its fsync (it is in the file), and replay reads one segment at a time.
See gateway/usage/spool.py for why applying a record twice is harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import structlog

from gateway.usage.record import UsageRecord
from gateway.usage.spool import Segment, Spool
from gateway.usage.writer import LedgerWriter
from tenants.db import within

log = structlog.get_logger("gateway.usage")

REPLAY_CHUNK = 2000
# Records per database transaction. Building a transaction's statements runs on the event loop
# (~0.13 ms of CPU per record), so a batch goes in chunks with the loop free between them: a
# chunk holds the loop for a few milliseconds, never the tens a 500-record batch would.
APPLY_CHUNK = 48


class Recorder:
    def __init__(
        self,
        spool: Spool,
        writer: LedgerWriter,
        *,
        flush_s: float = 0.1,
        batch_size: int = 500,
        retry_s: float = 1.0,
        deadline_s: float = 10.0,
        on_applied: Callable[[list[UsageRecord]], None] | None = None,
    ) -> None:
        self.spool = spool
        self.writer = writer
        self.flush_s = flush_s
        self.batch_size = batch_size
        self.retry_s = retry_s
        self.deadline_s = deadline_s
        self._on_applied = on_applied
        self._pending: list[UsageRecord] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._next_try = 0.0  # monotonic time of the next database try while it fails
        self.db_up = True
        self.applied = 0  # records the database took (new ones)
        self.failures = 0

    # -- request path --------------------------------------------------------------------------
    def record(self, rec: UsageRecord) -> None:
        self.spool.append(rec)
        self._pending.append(rec)
        if len(self._pending) >= self.batch_size:
            self._wake.set()

    # -- background ----------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="usage-recorder")

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.flush_s):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.tick()
            except Exception:  # never let the loop die: the records are in the spool
                log.exception("usage_recorder_tick_failed")

    @property
    def backlog(self) -> int:
        """Segments waiting to be replayed into the database."""
        return len(self.spool.pending_replay()) + int(self._current_needs_replay())

    def _current_needs_replay(self) -> bool:
        cur = self.spool.current
        return cur is not None and cur.needs_replay and cur.size > 0

    async def tick(self) -> None:
        batch, self._pending = self._pending, []
        spool = self.spool
        seg = spool.current
        assert seg is not None
        replaying = bool(spool.pending_replay())
        if seg.size >= spool.segment_bytes:
            spool.rotate(needs_replay=replaying)
        elif seg.needs_replay and not replaying and self._due():
            spool.rotate(needs_replay=False)  # back to the direct path; this one is replayed
        await spool.sync(seg)
        if batch and not seg.needs_replay:
            if await self._apply(batch):
                if seg is not spool.current:
                    spool.delete(seg)
            else:
                seg.needs_replay = True
                if seg is spool.current:
                    spool.rotate(needs_replay=True)
        elif seg is not spool.current and not seg.needs_replay:
            spool.delete(seg)  # rotated with nothing new: its batches all landed
        if spool.pending_replay() and self._due():
            await self._replay()

    def _due(self) -> bool:
        return self.db_up or time.monotonic() >= self._next_try

    async def _apply(self, records: list[UsageRecord]) -> bool:
        """Apply ``records`` chunk by chunk (each chunk idempotent on its own: a batch cut by a
        failure is replayed whole, and what landed of it is not counted twice)."""
        for i in range(0, len(records), APPLY_CHUNK):
            if i:
                await asyncio.sleep(0)  # the loop serves requests between chunks
            if not await self._apply_chunk(records[i : i + APPLY_CHUNK]):
                return False
        return True

    async def _apply_chunk(self, records: list[UsageRecord]) -> bool:
        try:
            n = await within(self.deadline_s, self.writer.apply(records))
        except Exception as exc:
            self.failures += 1
            if self.db_up:
                log.warning("usage_database_unavailable", error=type(exc).__name__)
            self.db_up = False
            self._next_try = time.monotonic() + self.retry_s
            return False
        if not self.db_up:
            log.info("usage_database_back")
        self.db_up = True
        self.applied += n
        if self._on_applied is not None:
            self._on_applied(records)
        return True

    async def _replay(self) -> None:
        for seg in self.spool.pending_replay():
            if not await self._replay_segment(seg):
                return
            self.spool.delete(seg)

    async def _replay_segment(self, seg: Segment) -> bool:
        await self.spool.sync(seg)
        records = await self.spool.read(seg)
        for i in range(0, len(records), REPLAY_CHUNK):
            if not await self._apply(records[i : i + REPLAY_CHUNK]):
                return False
        log.info("usage_spool_replayed", segment=seg.path.name, records=len(records))
        return True

    async def close(self, deadline_s: float = 5.0) -> None:
        """Stop the loop, then one last flush within ``deadline_s``; what does not land stays
        in the spool for the next start."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        landed = False
        with contextlib.suppress(Exception):
            async with asyncio.timeout(deadline_s):
                await self.tick()
                cur = self.spool.current
                landed = not self._pending and cur is not None and not cur.needs_replay
        self.spool.close(all_applied=landed)
