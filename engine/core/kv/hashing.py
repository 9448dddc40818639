"""Content keys of full blocks: a chain of 16-byte blake2b digests rooted in a namespace.

    root = H("ns" | namespace)            one per namespace (tenant cache salt)
    key_i = H(key_{i-1} | int32 token ids of block i)

Two namespaces never share a key because their roots differ; a key fixes the whole prefix up to
and including its block, so equal keys mean equal token prefixes (up to blake2b collisions).
Token ids are packed once per call with ``array('i')`` and hashed with one blake2b per block.

A ``CacheScope`` (one end user of a tenant) keeps only the namespace's leading ``shared_tokens``
shared. Blocks that lie wholly inside them are keyed as above; at the first block past them the
chain is re-rooted by mixing in the scope's salt, so every later key is private to the scope::

    shared_tokens = 2.5 blocks    block:  0      1      2 (straddles the end)   3
    unscoped                              k0 --> k1 --> k2 ---------------------> k3
    scope with salt s                     k0 --> k1 --> k2' --------------------> k3'

    k2' = H(H'(k1 | s) | int32 token ids of block 2), H' = blake2b personalised "kvgate-scope"

The shared keys (and so pins, prewarm, the host tier and disk snapshots of the tenant prefix)
are the same for every scope; no key past the shared part is equal across two salts.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from hashlib import blake2b

DIGEST_SIZE = 16
_ITEM = array("i").itemsize
_SCOPE_PERSON = b"kvgate-scope"


@dataclass(frozen=True, slots=True)
class CacheScope:
    """A private key space past the first ``shared_tokens`` tokens of a namespace.

    ``salt`` names the scope (bytes; a str is taken as its UTF-8 bytes, at construction: the field
    holds bytes, the type the worker protocol's codec decodes). Callers pass a digest, never an
    end user's raw id: the salt reaches workers and tools.
    """

    salt: bytes
    shared_tokens: int

    def __post_init__(self) -> None:
        if isinstance(self.salt, str):  # accepted, typed bytes
            object.__setattr__(self, "salt", self.salt.encode())
        if not isinstance(self.salt, bytes) or not self.salt:
            raise ValueError("cache scope salt must be non-empty bytes or str")
        if isinstance(self.shared_tokens, bool) or not isinstance(self.shared_tokens, int):
            raise ValueError("cache scope shared_tokens must be an int")
        if self.shared_tokens < 0:
            raise ValueError(f"cache scope shared_tokens must be >= 0, got {self.shared_tokens}")

    @property
    def salt_bytes(self) -> bytes:
        assert isinstance(self.salt, bytes)  # normalised at construction
        return self.salt

    def first_private_block(self, block_size: int) -> int:
        """Index of the first block keyed privately (the block straddling the end is private)."""
        return self.shared_tokens // block_size


@lru_cache(maxsize=4096)
def root_key(namespace: str) -> bytes:
    return blake2b(namespace.encode(), digest_size=DIGEST_SIZE, person=b"kvgate-ns").digest()


def scope_parent(parent: bytes, salt: bytes) -> bytes:
    """The parent the first private block of a scope chains from (``parent``: the key of the
    last shared block, or the namespace root)."""
    return blake2b(parent + salt, digest_size=DIGEST_SIZE, person=_SCOPE_PERSON).digest()


def block_keys(
    parent: bytes,
    token_ids: Sequence[int],
    block_size: int,
    first: int,
    last: int,
    scope: CacheScope | None = None,
) -> list[bytes]:
    """Keys of full blocks ``first .. last-1`` of ``token_ids``; ``parent`` keys block first-1
    (the root for first == 0) under the same ``scope``."""
    if scope is None:
        return _chain(parent, token_ids, block_size, first, last)
    split = scope.first_private_block(block_size)
    if split < first or split >= last:  # the whole range on one side of the re-rooting
        return _chain(parent, token_ids, block_size, first, last)
    keys = _chain(parent, token_ids, block_size, first, split)
    rerooted = scope_parent(keys[-1] if keys else parent, scope.salt_bytes)
    keys.extend(_chain(rerooted, token_ids, block_size, split, last))
    return keys


def _chain(
    parent: bytes, token_ids: Sequence[int], block_size: int, first: int, last: int
) -> list[bytes]:
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
