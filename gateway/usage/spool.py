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

Adoption. Spools of one host live side by side under one root (``<var>/usage-spool/port-N``,
one per listening port), so a gateway restarted on another port would never see what its
predecessor left. ``open`` therefore also adopts every sibling directory whose lock no live
process holds (a lock dies with its process, SIGKILL included)::

    take the orphan's lock (non-blocking: held -> a live gateway, skip it)
    -> rename each of its segments into this spool under a new number (needs replay)
    -> fsync this directory, then the orphan's -> remove its files and the directory

A spool records which database its records are for (``<dir>/database``: a digest of the
database URL without its password); an orphan written for another database is never adopted
(its records would land in the wrong ledger), one without the file (an older version's) is.

Every segment is in exactly one directory at every moment (``rename`` is atomic), so a crash
mid-adoption loses nothing: what was moved is in a spool of this process (adopted in turn when
it dies), what was not is still in the orphan. Two gateways starting together never both take a
segment: only the lock holder moves it. A lock is trusted only while its file is still the one
at ``<dir>/lock`` (same inode after ``flock``): an adopter removes the file before releasing it,
so whoever waited on the old file retries on a fresh one.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import structlog
from sqlalchemy.engine import make_url

from gateway.usage.record import UsageRecord, decode_lines, encode_line

log = structlog.get_logger("gateway.usage")

_SEGMENT = re.compile(r"^seg-(\d{12})\.jsonl$")
_PART = ".part"  # a segment being copied in from another file system (removed at open)
LOCK_WAIT_S = 5.0  # an adopter holds a directory's lock for a few renames, never longer


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
    def __init__(
        self,
        directory: Path,
        segment_bytes: int = 4 << 20,
        root: Path | None = None,
        database: str | None = None,
    ) -> None:
        self.dir = directory
        self.segment_bytes = segment_bytes
        self.root = root  # sibling spools under it are adopted at open; None: none
        self.database = database  # the database's digest (``database_tag``); None: unknown
        self.closed: list[Segment] = []  # oldest first; each needs replay or awaits deletion
        self.current: Segment | None = None
        self._lock_fd: int | None = None
        self.write_errors = 0
        self.adopted = 0  # segments taken from spools of processes that are gone

    def open(self) -> None:
        """Take the directory's lock, keep the segments left by an earlier process, adopt those
        of dead siblings under ``root`` (all need replay) and open a new current segment.
        Blocking file work (a thread at start-up: ``Ledger.start``)."""
        self._lock_fd = _lock_own(self.dir)
        if self.database is not None:
            _write_tag(self.dir, self.database)
        for path in sorted(self.dir.iterdir()):
            m = _SEGMENT.fullmatch(path.name)
            if m:
                seg = Segment(int(m.group(1)), path, size=path.stat().st_size, needs_replay=True)
                self.closed.append(seg)
            elif path.name.endswith(_PART):
                path.unlink()  # a copy cut short: its source was not removed
        if self.root is not None:
            self._adopt_orphans(self.root)
        self.rotate(needs_replay=False)

    def _adopt_orphans(self, root: Path) -> None:
        try:
            siblings = sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())
        except FileNotFoundError:
            return
        mine = self.dir.resolve()
        for orphan in siblings:
            if orphan.resolve() == mine:
                continue
            fd = _try_lock(orphan, create=False)
            if fd is None:  # a live gateway's, or no spool, or already adopted
                continue
            tag = _read_tag(orphan)
            if tag is not None and tag != self.database:
                os.close(fd)
                log.warning("usage_spool_of_another_database", directory=str(orphan))
                continue
            try:
                moved = self._take_segments(orphan)
                (orphan / _TAG).unlink(missing_ok=True)
                (orphan / "lock").unlink()
                with contextlib.suppress(OSError):  # something else lives there: leave it
                    orphan.rmdir()
                _fsync_dir(root)
            finally:
                os.close(fd)
            self.adopted += moved
            log.info("usage_spool_adopted", directory=str(orphan), segments=moved)

    def _take_segments(self, orphan: Path) -> int:
        """Move the orphan's segments here (numbered after ours); both directories fsynced."""
        moved = 0
        for path in sorted(orphan.iterdir()):
            if not _SEGMENT.fullmatch(path.name):
                continue
            seq = self._next_seq()
            dest = self.dir / f"seg-{seq:012d}.jsonl"
            _move(path, dest)
            self.closed.append(Segment(seq, dest, size=dest.stat().st_size, needs_replay=True))
            moved += 1
        _fsync_dir(self.dir)  # the new names first, then the old ones gone
        _fsync_dir(orphan)
        return moved

    def _next_seq(self) -> int:
        return max([s.seq for s in self.closed] + [self.current.seq if self.current else 0]) + 1

    def _new(self, needs_replay: bool) -> Segment:
        seq = self._next_seq()
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


_TAG = "database"


def database_tag(url: str) -> str:
    """A digest naming a database: its URL without password or query, a SQLite file's path
    made absolute (one file, however the URL spells it)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database:
        parsed = parsed.set(database=str(Path(parsed.database).resolve()))
    name = parsed.set(query={}).render_as_string(hide_password=True)
    return hashlib.blake2b(name.encode(), digest_size=8).hexdigest()


def _write_tag(directory: Path, tag: str) -> None:
    path = directory / _TAG
    if _read_tag(directory) == tag:
        return
    tmp = path.with_name(_TAG + ".tmp")
    tmp.write_text(tag + "\n")
    os.rename(tmp, path)
    _fsync_dir(directory)


def _read_tag(directory: Path) -> str | None:
    try:
        return (directory / _TAG).read_text().strip()
    except FileNotFoundError:
        return None


def _try_lock(directory: Path, *, create: bool) -> int | None:
    """An fd holding the exclusive flock of ``<directory>/lock``, or None: another process holds
    it, the lock file is missing (``create`` False), or the file was replaced while we waited
    (an adopter removed it: the lock we got guards nothing)."""
    path = directory / "lock"
    try:
        fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o600)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        now = os.stat(path)
        held = os.fstat(fd)
        if (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            return fd
    except (BlockingIOError, FileNotFoundError):
        pass
    os.close(fd)
    return None


def _lock_own(directory: Path) -> int:
    """This process's lock of its own spool directory. An adopter may hold it for a moment (the
    previous process on this port died and another gateway is taking its segments): wait for
    it up to ``LOCK_WAIT_S``; a lock held longer is a live gateway's."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        directory.mkdir(parents=True, exist_ok=True)  # again: an adopter may have removed it
        fd = _try_lock(directory, create=True)
        if fd is not None:
            return fd
        if time.monotonic() >= deadline:
            raise SpoolLocked(
                f"usage spool {directory} is used by another process "
                "(give each gateway process its own KVGATE_USAGE_SPOOL_DIR)"
            )
        time.sleep(0.05)


def _move(src: Path, dest: Path) -> None:
    """``rename``; across file systems a copy (fsynced, renamed into place) then the unlink, so
    the records are in ``dest`` before they leave ``src`` (a crash may leave them in both:
    harmless, a replay is idempotent)."""
    try:
        os.rename(src, dest)
        return
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    part = dest.with_name(dest.name + _PART)
    shutil.copyfile(src, part)
    fd = os.open(part, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(part, dest)
    src.unlink()
