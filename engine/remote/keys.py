"""The keys of a prompt's KV blocks, as a worker's KV events name them.

A worker reports the blocks it stores and drops by key (``messages.Stored`` / ``Removed``); the
gateway's KV index (gateway/cluster/kvindex.py) finds the workers holding a prompt's longest
cached prefix by computing the same keys for the prompt (engine/core/kv/hashing.py: chained
from the namespace's root, re-rooted past the shared tokens for an end user's scope).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.core.kv.hashing import CacheScope, block_keys, root_key


def reusable_block_keys(
    namespace: str, token_ids: Sequence[int], block_size: int, scope: CacheScope | None = None
) -> list[bytes]:
    """Keys of the prompt's full blocks the engine could serve from its cache (never the block
    of the last token, which is always computed to sample from)."""
    n = (len(token_ids) - 1) // block_size
    return block_keys(root_key(namespace), token_ids, block_size, 0, n, scope)
