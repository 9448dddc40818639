"""Content keys of full blocks: a chain of 16-byte blake2b digests rooted in a namespace.

    root = H("ns" | namespace)            one per namespace (tenant cache salt)
    key_i = H(key_{i-1} | int32 token ids of block i)

Two namespaces never share a key because their roots differ; a key fixes the whole prefix up to
and including its block, so equal keys mean equal token prefixes (up to blake2b collisions).
Token ids are packed once per call with ``array('i')`` and hashed with one blake2b per block.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from functools import lru_cache
from hashlib import blake2b

DIGEST_SIZE = 16
_ITEM = array("i").itemsize


@lru_cache(maxsize=4096)
def root_key(namespace: str) -> bytes:
    return blake2b(namespace.encode(), digest_size=DIGEST_SIZE, person=b"kvgate-ns").digest()


def block_keys(
    parent: bytes, token_ids: Sequence[int], block_size: int, first: int, last: int
) -> list[bytes]:
    """Keys of full blocks ``first .. last-1`` of ``token_ids``; ``parent`` keys block first-1."""
    if last <= first:
        return []
    data = array("i", token_ids[first * block_size : last * block_size]).tobytes()
    step = block_size * _ITEM
    keys: list[bytes] = []
    append_key = keys.append
    for off in range(0, len(data), step):
        parent = blake2b(parent + data[off : off + step], digest_size=DIGEST_SIZE).digest()
        append_key(parent)
    return keys
