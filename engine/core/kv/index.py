"""Key index strategies: content key -> registered block, or nothing when reuse is off.

``PrefixCache`` talks to one of these objects instead of testing a flag in every method:
``KeyIndex`` hashes full blocks and shares them; ``NullIndex`` (enable_reuse=False) hashes
nothing, matches nothing and registers nothing, so every block stays private to its request.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import cast

from engine.core.kv.block import Block
from engine.core.kv.hashing import CacheScope, block_keys, root_key


class KeyIndex:
    def __init__(self) -> None:
        self._map: dict[bytes, Block] = {}

    def __len__(self) -> int:
        return len(self._map)

    def root(self, namespace: str) -> bytes | None:
        return root_key(namespace)

    def keys(
        self,
        parent: bytes | None,
        token_ids: Sequence[int],
        block_size: int,
        first: int,
        last: int,
        scope: CacheScope | None = None,
    ) -> list[bytes | None]:
        assert parent is not None
        # a fresh list the caller owns (block_keys keeps no reference): widening it is sound
        return cast(
            "list[bytes | None]", block_keys(parent, token_ids, block_size, first, last, scope)
        )

    def match(self, keys: Sequence[bytes | None]) -> list[Block]:
        """Blocks of the longest run of registered keys from the start of ``keys``."""
        get = self._map.get
        out: list[Block] = []
        append = out.append
        for key in keys:
            block = get(key) if key is not None else None
            if block is None:
                break
            append(block)
        return out

    def add(self, key: bytes | None, block: Block) -> bool:
        """Register ``block`` under ``key``; False when the key is taken (block stays private)."""
        if key is None or key in self._map:
            return False
        self._map[key] = block
        return True

    def remove(self, key: bytes) -> None:
        del self._map[key]

    def items(self) -> Iterator[tuple[bytes, Block]]:
        return iter(self._map.items())


class NullIndex:
    """Prefix reuse disabled: no keys, no matches, no sharing."""

    def __len__(self) -> int:
        return 0

    def root(self, namespace: str) -> bytes | None:
        return None

    def keys(
        self,
        parent: bytes | None,
        token_ids: Sequence[int],
        block_size: int,
        first: int,
        last: int,
        scope: CacheScope | None = None,
    ) -> list[bytes | None]:
        return [None] * max(0, last - first)

    def match(self, keys: Sequence[bytes | None]) -> list[Block]:
        return []

    def add(self, key: bytes | None, block: Block) -> bool:
        return False

    def remove(self, key: bytes) -> None:
        raise AssertionError("NullIndex holds no keys")

    def items(self) -> Iterator[tuple[bytes, Block]]:
        return iter(())
