"""Which workers hold which KV blocks, learned from the workers' KV event streams.

Keys are the engine's chained block keys (engine/core/kv/hashing.py), so the gateway computes a
prompt's keys itself and finds the worker holding its longest cached prefix::

    prompt blocks:  k0 -> k1 -> k2 -> k3 -> k4          (k_i fixes the whole prefix up to block i)
    index:          k0:{A,B} k1:{A,B} k2:{A} k3:{A}     -> A holds 4 blocks, B 2

A worker holds a key on the device, in its host-memory tier, or both (the tier events of
engine/serving/worker/events.py). A host-tier block still counts (a copy in beats recomputing it),
but at the longest prefix the workers holding it on the device come first::

    k3:{A: host, B: device}    -> 4 blocks, B (A only when no worker has it on the device)

Bounded: beyond ``max_keys`` the oldest keys are forgotten (a lost hint, never a wrong one:
the worker still checks its own cache).

A request with a cache scope (an end user) looks its prompt up under the same scope the engine
keys it with (engine/core/kv/hashing.py): the tenant prefix is found wherever it is, the rest only
where this end user's own earlier turns are.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from engine.api import CacheScope
from engine.remote.keys import reusable_block_keys
from engine.remote.messages import KvEvent, Removed, Stored, Tier, Tiered

DEVICE = 1  # where a worker holds a key (bits)
HOST = 2
_TIER_BIT: dict[Tier, int] = {"device": DEVICE, "host": HOST}


class KvIndex:
    def __init__(self, max_keys: int = 1_000_000) -> None:
        self._holders: OrderedDict[str, dict[str, int]] = OrderedDict()  # key -> worker -> bits
        self._max = max_keys

    def __len__(self) -> int:
        return len(self._holders)

    def apply(self, worker_id: str, batch: Sequence[KvEvent]) -> None:
        for event in batch:
            if isinstance(event, Stored):
                self._set(event.key, worker_id, DEVICE)
            elif isinstance(event, Removed):
                self._clear(event.key, worker_id, DEVICE)
            elif isinstance(event, Tiered):
                if event.tier is None:
                    self._clear(event.key, worker_id, HOST)
                else:
                    self._set(event.key, worker_id, _TIER_BIT[event.tier])

    def _set(self, key: str, worker_id: str, bit: int) -> None:
        holders = self._holders
        ws = holders.setdefault(key, {})
        ws[worker_id] = ws.get(worker_id, 0) | bit
        holders.move_to_end(key)
        if len(holders) > self._max:
            holders.popitem(last=False)

    def _clear(self, key: str, worker_id: str, bit: int) -> None:
        ws = self._holders.get(key)
        if ws is None or worker_id not in ws:
            return
        left = ws[worker_id] & ~bit
        if left:
            ws[worker_id] = left
        else:
            del ws[worker_id]
            if not ws:
                del self._holders[key]

    def drop_worker(self, worker_id: str) -> None:
        for key in [k for k, ws in self._holders.items() if worker_id in ws]:
            ws = self._holders[key]
            del ws[worker_id]
            if not ws:
                del self._holders[key]

    def tiers(self, key: str) -> dict[str, int]:
        """Worker -> bits (``DEVICE`` | ``HOST``) for one key (hex), for reports and tests."""
        return dict(self._holders.get(key, {}))

    def check_integrity(self) -> None:
        assert len(self._holders) <= self._max, "index above its bound"
        for key, ws in self._holders.items():
            assert ws, f"key {key} without holders"
            assert all(0 < bits <= DEVICE | HOST for bits in ws.values()), f"bad bits on {key}"

    def longest(
        self,
        namespace: str,
        token_ids: Sequence[int],
        block_size: int,
        scope: CacheScope | None = None,
    ) -> tuple[int, frozenset[str]]:
        """(blocks, workers): the longest prefix of full blocks some worker holds, in either
        tier; the workers holding its last block on the device, else those holding it in host
        memory."""
        keys = reusable_block_keys(namespace, token_ids, block_size, scope)
        holders = self._holders
        for i in range(len(keys) - 1, -1, -1):
            ws = holders.get(keys[i].hex())
            if ws:
                on_device = frozenset(w for w, bits in ws.items() if bits & DEVICE)
                return i + 1, on_device or frozenset(ws)
        return 0, frozenset()
