"""Pinned prompts' KV to and from disk for ``EngineCore`` (engine thread only).

pin succeeded           -> save: K/V of its (device, READY) blocks copied to the host now,
                           written to disk by one background thread (engine/runtime/snapshot.py)
pin of an uncached one  -> restore: a matching snapshot is written into fresh device blocks
                           (an internal admission over the prompt's full blocks: its new
                           blocks take the snapshot's K/V and are committed READY), then the
                           pin is taken; nothing goes through the model
forget (tenant deleted) -> the namespace's file is removed by the writer thread, after any write
                           of it already queued (so a write in flight cannot bring it back)

One file per namespace: the prompt version pinned last (a new version's pin overwrites the
previous version's file; a rollback's pin writes the older version again).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from engine.core.kv import PrefixCache
from engine.core.kv.pins import resolve_pin
from engine.core.kv.transfers import TransferPlan
from engine.runtime.snapshot import ModelIdentity, SnapshotStore, fingerprint
from engine.runtime.snapshot_key import SnapshotKeyError, snapshot_key
from engine.runtime.tiers.host_pool import read_blocks, write_blocks

_RESTORE_PREFIX = "__snap-"
log = logging.getLogger(__name__)


class DeviceKV(Protocol):
    """The device KV the snapshots read and write: the model runner's."""

    @property
    def kv_caches(self) -> Any: ...  # per layer (K, V) tensors, [blocks, block_size, ...]

    def transfer(self, plan: TransferPlan) -> int: ...  # host-tier copies; microseconds


class Snapshots:
    """Snapshots of one device's KV (``device``) in ``store``. The engine core passes its
    prefix cache to ``restore`` / ``save``: the blocks to fill or read are the cache's."""

    def __init__(self, store: SnapshotStore, device: DeviceKV) -> None:
        self.store = store
        self.device = device
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="kv-snapshot")
        self._pending: list[Future[None]] = []
        self._ids = itertools.count()
        # namespace -> prompt on disk or being written. Engine thread, and ``forget`` from the
        # event loop: under the lock, so a save and a forget reach the writer in one order.
        self._known: dict[str, tuple[int, ...]] = {}
        self._lock = threading.Lock()
        self.restored = 0
        self.saved = 0
        self.restore_seconds = 0.0

    @classmethod
    def for_runner(
        cls, directory: str | Path, model_path: str | Path, runner: Any, secret: str | None = None
    ) -> Snapshots | None:
        """Snapshots under ``directory`` for ``runner``'s KV layout; None (logged: the engine
        runs without snapshots) when no MAC key can be had (engine/runtime/snapshot_key.py)."""
        try:
            key = snapshot_key(directory, secret)
        except SnapshotKeyError as exc:
            log.warning("kv snapshots off: %s", exc)
            return None
        model, tokenizer = fingerprint(model_path)
        k0 = runner.kv_caches[0][0]
        linears = runner.decoder.lm_head.dtype  # the dtype the linears compute in
        if linears != k0.dtype:  # K/V computed by bf16 linears beside a float32 cache
            model = f"{model}+{str(linears).removeprefix('torch.')}-linears"
        identity = ModelIdentity(
            model=model,
            tokenizer=tokenizer,
            dtype=str(k0.dtype).removeprefix("torch."),
            block_size=int(runner.block_size),
            layout=(len(runner.kv_caches), 2, *(int(d) for d in k0.shape[1:])),
        )
        return cls(SnapshotStore(directory, identity, key), runner)

    def restore(self, cache: PrefixCache, namespace: str, token_ids: tuple[int, ...]) -> bool:
        """Put the prompt's snapshot into the device cache; False when none is usable."""
        start = time.perf_counter()
        kv = self.store.load(namespace, token_ids)
        if kv is None:
            return False
        full = kv.shape[0] * cache.block_size
        rid = f"{_RESTORE_PREFIX}{next(self._ids)}"
        alloc = cache.allocate(rid, namespace, token_ids[:full])
        if alloc is None:
            return False  # no room now: computed the usual way
        cache.run_transfers(self.device.transfer)  # blocks found in the host tier come first
        first = alloc.match.num_blocks
        write_blocks(self.device.kv_caches, alloc.block_table[first:], kv[first:])
        cache.commit(rid, full)
        cache.free(rid)
        with self._lock:
            self._known[namespace] = token_ids
        self.restored += 1
        elapsed = time.perf_counter() - start
        self.restore_seconds += elapsed
        cache.tiers.count_snapshot_restore(int(elapsed * 1e6))
        return True

    def save(self, cache: PrefixCache, namespace: str, token_ids: tuple[int, ...]) -> None:
        """Snapshot a just-pinned prompt unless the same snapshot is on disk already."""
        if self._known.get(namespace) == token_ids or self.store.matches(namespace, token_ids):
            return
        blocks = resolve_pin(cache.index, namespace, token_ids, cache.block_size)
        if not isinstance(blocks, list):
            return
        kv = read_blocks(self.device.kv_caches, [b.block_id for b in blocks])
        with self._lock:
            self._pending = [f for f in self._pending if not f.done()]
            self._pending.append(self._writer.submit(self._write, namespace, token_ids, kv))
            self._known[namespace] = token_ids
        self.saved += 1

    def forget(self, namespace: str) -> Future[bool]:
        """Remove the namespace's snapshot (any thread); resolves to whether a file was there."""
        with self._lock:
            self._known.pop(namespace, None)
            return self._writer.submit(self.store.remove, namespace)

    def _write(self, namespace: str, token_ids: tuple[int, ...], kv: Any) -> None:
        try:
            self.store.save(namespace, token_ids, kv)
        except OSError as exc:  # a full or read-only disk costs the snapshot, not the engine
            log.warning("kv snapshot not written: %s", exc.__class__.__name__)

    def flush(self) -> None:
        """Wait for the snapshots being written (graceful shutdown, tests)."""
        with self._lock:
            pending, self._pending = self._pending, []
        for fut in pending:
            fut.result()

    def close(self) -> None:
        self.flush()
        self._writer.shutdown(wait=True)
