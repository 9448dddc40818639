"""A vLLM server's KV events in the gateway's block keys (no torch).

vLLM names a block by its own hash (salted in the first block, chained after it); the gateway's KV
index (gateway/cluster/kvindex.py) names it by kvgate's chained key (engine/core/kv/hashing.py)
rooted in the namespace, which for a vLLM request is its cache salt (``vllm_wire.vllm_salt``). The
events carry the blocks' token ids, so the key of each stored block is computed here from its
parent's key::

    BlockStored(parent=None, salt=s, tokens=b0 b1)  ->  k0 = H(root(s), b0), k1 = H(k0, b1)
    BlockStored(parent=h1, tokens=b2)               ->  k2 = H(key[h1], b2)
    BlockRemoved(h1)                                ->  Removed(k1)
    AllCleared                                      ->  Removed for every key known

A block whose parent this map never saw (stored before we subscribed, or by an unsalted request:
never one of the gateway's) is skipped: a lost hint, never a wrong one. Blocks in another medium
than the device (vLLM's CPU offloading) are reported as the host tier.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.core.kv.hashing import block_keys, root_key
from engine.remote.kv_events import AllCleared, BlockHash, BlockRemoved, BlockStored, KVEvent
from engine.remote.messages import KvEvent, Removed, Stored, Tiered

DEVICE_MEDIA = frozenset({None, "GPU"})  # vLLM's CPU build reports its KV cache as "GPU" too


class VllmKeyMap:
    """One server's vLLM block hashes -> the gateway's keys (hex), fed in event order."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._keys: dict[BlockHash, tuple[bytes, bool]] = {}  # hash -> (key, on the device)
        self.skipped = 0  # stored blocks whose parent was unknown (or unsalted first blocks)

    def __len__(self) -> int:
        return len(self._keys)

    def key_of(self, block_hash: BlockHash) -> str | None:
        held = self._keys.get(block_hash)
        return held[0].hex() if held is not None else None

    def translate(self, events: Iterable[KVEvent]) -> list[KvEvent]:
        out: list[KvEvent] = []
        for event in events:
            if isinstance(event, BlockStored):
                out.extend(self._stored(event))
            elif isinstance(event, BlockRemoved):
                out.extend(self._removed(event.block_hashes))
            elif isinstance(event, AllCleared):
                out.extend(self._removed(list(self._keys)))
        return out

    def _stored(self, e: BlockStored) -> list[KvEvent]:
        bs = e.block_size or self.block_size
        n = len(e.block_hashes)
        if len(e.token_ids) != n * bs:
            self.skipped += n
            return []
        if e.parent_block_hash is None:
            if e.cache_salt is None:
                self.skipped += n
                return []
            namespace, parent = root_key(e.cache_salt).hex(), root_key(e.cache_salt)
        else:
            held = self._keys.get(e.parent_block_hash)
            if held is None:
                self.skipped += n
                return []
            parent = held[0]
            namespace = ""  # not known past the first block; the index reads only the key
        device = e.medium in DEVICE_MEDIA
        out: list[KvEvent] = []
        prev = parent
        keys = block_keys(parent, e.token_ids, bs, 0, n)
        for block_hash, key in zip(e.block_hashes, keys, strict=True):
            self._keys[block_hash] = (key, device)
            if device:
                out.append(Stored(namespace, key.hex(), prev.hex()))
            else:
                out.append(Tiered(key.hex(), "host"))
            prev = key
        return out

    def _removed(self, hashes: Iterable[BlockHash]) -> list[KvEvent]:
        out: list[KvEvent] = []
        for block_hash in hashes:
            held = self._keys.pop(block_hash, None)
            if held is None:
                continue
            key, device = held
            out.append(Removed(key.hex()) if device else Tiered(key.hex(), None))
        return out
