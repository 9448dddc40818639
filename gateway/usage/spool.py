"""The local append-only spool of usage records: segment files in one directory.

    <dir>/lock                 flock held by the one gateway process using the directory
    <dir>/seg-000000000007.jsonl   one JSON record per line, appended, never rewritten

A record is written to the current segment with one ``write`` when its request ends (in the
kernel from then on: it survives the process being killed), and the segment is fsynced once per
batch before that batch goes to the database (on disk from then on: it survives the machine).
A segment is deleted only once every record in it is known to be in the database; anything still
in a file is applied again at start or when the database is back, which is harmless: the
database skips records it has (tenants/usage_models.py). So the files hold a superset of what is
missing from the database, never less.

``needs_replay`` marks a segment whose records did not all reach the database with the batch
they came in (the database failed, or the segment predates this process): those segments are
read back from disk and applied (``Recorder``, gateway/usage/recorder.py).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
from dataclasses import dataclass
from pathlib import Path

import structlog

from gateway.usage.record import UsageRecord, decode_lines, encode_line

log = structlog.get_logger("gateway.usage")

_SEGMENT = re.compile(r"^seg-(\d{12})\.jsonl$")


class SpoolLocked(RuntimeError):
    """Another process uses this spool directory (each gateway process needs its own)."""


@dataclass(eq=False)
class Segment:
    seq: int
    path: Path
    fd: int | None = None  # open while it is the current segment
    size: int = 0
    needs_replay: bool = False

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Spool:
    def __init__(self, directory: Path, segment_bytes: int = 4 << 20) -> None:
        self.dir = directory
        self.segment_bytes = segment_bytes
        self.closed: list[Segment] = []  # oldest first; each needs replay or awaits deletion
        self.current: Segment | None = None
        self._lock_fd: int | None = None
        self.write_errors = 0

    def open(self) -> None:
        """Take the directory's lock, adopt the segments left by an earlier process (all need
        replay) and open a new current segment."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise SpoolLocked(
                f"usage spool {self.dir} is used by another process "
                "(give each gateway process its own KVGATE_USAGE_SPOOL_DIR)"
            ) from None
        self._lock_fd = fd
        for path in sorted(self.dir.iterdir()):
            m = _SEGMENT.fullmatch(path.name)
            if m:
                seg = Segment(int(m.group(1)), path, size=path.stat().st_size, needs_replay=True)
                self.closed.append(seg)
        self.rotate(needs_replay=False)

    def _new(self, needs_replay: bool) -> Segment:
        seq = max([s.seq for s in self.closed] + [self.current.seq if self.current else 0]) + 1
        path = self.dir / f"seg-{seq:012d}.jsonl"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        _fsync_dir(self.dir)  # the new name survives a machine crash before its first fsync
        return Segment(seq, path, fd, needs_replay=needs_replay)

    def rotate(self, *, needs_replay: bool) -> Segment | None:
        """Start a new current segment (``needs_replay``: its records will reach the database
        from the file); the old one joins ``closed`` and is returned (its fd stays open until
        it is fsynced: ``seal``)."""
        old = self.current
        self.current = self._new(needs_replay)
        if old is not None:
            self.closed.append(old)
        return old

    def append(self, rec: UsageRecord) -> None:
        """One ``write`` (the request path: microseconds, no fsync)."""
        seg = self.current
        assert seg is not None and seg.fd is not None, "spool not open"
        data = encode_line(rec)
        try:
            view = memoryview(data)
            while view:
                n = os.write(seg.fd, view)
                view = view[n:]
            seg.size += len(data)
        except OSError as exc:  # disk full, I/O error: the record still goes to the database
            self.write_errors += 1
            log.error("usage_spool_write_failed", error=str(exc), request_id=rec.request_id)

    async def sync(self, seg: Segment) -> None:
        """fsync ``seg`` (on a thread); a closed segment's fd is closed after."""
        fd = seg.fd
        if fd is None:
            return
        await asyncio.to_thread(os.fsync, fd)
        if seg is not self.current:
            seg.close()

    def pending_replay(self) -> list[Segment]:
        return [s for s in self.closed if s.needs_replay]

    async def read(self, seg: Segment) -> list[UsageRecord]:
        data = await asyncio.to_thread(seg.path.read_bytes)
        records, bad = decode_lines(data)
        if bad:
            log.warning("usage_spool_lines_skipped", segment=seg.path.name, lines=bad)
        return records

    def delete(self, seg: Segment) -> None:
        seg.close()
        self.closed.remove(seg)
        seg.path.unlink(missing_ok=True)

    def close(self, *, all_applied: bool) -> None:
        """Close every file; ``all_applied``: the current segment's records are all in the
        database, so its file goes too."""
        cur, self.current = self.current, None
        if cur is not None:
            cur.close()
            if all_applied and not cur.needs_replay:
                cur.path.unlink(missing_ok=True)
        for seg in self.closed:
            seg.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
