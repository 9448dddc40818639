"""Factories for prefix-cache tests: every public call is followed by check_integrity()."""

from __future__ import annotations

from typing import Any

import pytest

from engine.core.kv import PrefixCache

BLOCK_SIZES = [1, 2, 16, 64]


class CheckedCache:
    """Proxy that runs ``check_integrity()`` after every public method call."""

    def __init__(self, cache: PrefixCache) -> None:
        self.inner = cache
        cache.check_integrity()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name.startswith("_") or not callable(attr):
            return attr

        def checked(*args: Any, **kwargs: Any) -> Any:
            result = attr(*args, **kwargs)
            self.inner.check_integrity()
            return result

        return checked


def make_cache(num_blocks: int = 16, block_size: int = 16, **kwargs: Any) -> Any:
    return CheckedCache(PrefixCache(num_blocks, block_size, **kwargs))


def toks(n: int, base: int = 0) -> list[int]:
    return list(range(base, base + n))


@pytest.fixture(params=BLOCK_SIZES, ids=lambda bs: f"bs{bs}")
def bs(request: pytest.FixtureRequest) -> int:
    return int(request.param)
