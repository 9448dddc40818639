"""Which workers hold which KV blocks, learned from the workers' KV event streams.

Keys are the engine's chained block keys (engine/kv/hashing.py), so the gateway computes a
prompt's keys itself and finds the worker holding its longest cached prefix::

    prompt blocks:  k0 -> k1 -> k2 -> k3 -> k4          (k_i fixes the whole prefix up to block i)
    index:          k0:{A,B} k1:{A,B} k2:{A} k3:{A}     -> A holds 4 blocks, B 2

Bounded: beyond ``max_keys`` the oldest keys are forgotten (a lost hint, never a wrong one:
the worker still checks its own cache).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from engine.kv.hashing import block_keys, root_key
from engine.worker.events import REMOVED, STORED


class KvIndex:
    def __init__(self, max_keys: int = 1_000_000) -> None:
        self._holders: OrderedDict[str, set[str]] = OrderedDict()
        self._max = max_keys

    def __len__(self) -> int:
        return len(self._holders)

    def apply(self, worker_id: str, batch: Sequence[Sequence[object]]) -> None:
        holders = self._holders
        for event in batch:
            kind, key = event[0], event[2] if event[0] == STORED else event[1]
            assert isinstance(key, str)
            if kind == STORED:
                holders.setdefault(key, set()).add(worker_id)
                holders.move_to_end(key)
                if len(holders) > self._max:
                    holders.popitem(last=False)
            elif kind == REMOVED:
                ws = holders.get(key)
                if ws is not None:
                    ws.discard(worker_id)
                    if not ws:
                        del holders[key]

    def drop_worker(self, worker_id: str) -> None:
        for key in [k for k, ws in self._holders.items() if worker_id in ws]:
            ws = self._holders[key]
            ws.discard(worker_id)
            if not ws:
                del self._holders[key]

    def longest(
        self, namespace: str, token_ids: Sequence[int], block_size: int
    ) -> tuple[int, frozenset[str]]:
        """(blocks, workers): the longest prefix of full blocks some worker holds."""
        n = (len(token_ids) - 1) // block_size  # the engine never reuses the last token's block
        keys = block_keys(root_key(namespace), token_ids, block_size, 0, n)
        holders = self._holders
        for i in range(len(keys) - 1, -1, -1):
            ws = holders.get(keys[i].hex())
            if ws:
                return i + 1, frozenset(ws)
        return 0, frozenset()
