"""Cache scopes through the engine (tiny random model): end users share the pinned prefix only."""

from __future__ import annotations

from engine import AsyncEngine, CacheScope
from tests.engine._tiny_model import kv_bytes, tiny_model_dir
from tests.engine.test_engine import GREEDY, _prompts, make_engine

SYSTEM = _prompts(21, 1, 22, (0, 1))[0]  # 22 tokens: 5 full blocks of 4, block 5 straddles


def scope(user: str) -> CacheScope:
    return CacheScope(f"salt-{user}".encode(), len(SYSTEM))


def test_visitors_share_the_pinned_prefix_and_reuse_only_their_own_turns() -> None:
    eng = make_engine(num_blocks=96)
    handle = eng.pin_prefix("acme", SYSTEM)
    assert handle.num_tokens == 20
    convo = [*SYSTEM, *range(100, 130)]
    first = eng.generate([convo], GREEDY, namespace="acme", cache_scope=scope("a"))[0]
    assert first.num_cached_tokens == 20  # the pinned prefix
    # B sends A's exact conversation: the prefix, rounded down to blocks, and nothing more
    other = eng.generate([convo], GREEDY, namespace="acme", cache_scope=scope("b"))[0]
    assert other.num_cached_tokens == 20 and other.token_ids == first.token_ids
    # A resends it: its own blocks beyond the prefix (the last token is always computed)
    again = eng.generate([convo], GREEDY, namespace="acme", cache_scope=scope("a"))[0]
    assert again.num_cached_tokens == (len(convo) - 1) // 4 * 4 > 20
    assert again.token_ids == first.token_ids
    # A's next turn continues from its answer (decode blocks were keyed in its scope too)
    turn = [*convo, *first.token_ids, 5, 6]
    nxt = eng.generate([turn], GREEDY, namespace="acme", cache_scope=scope("a"))[0]
    assert nxt.num_cached_tokens >= (len(convo) + len(first.token_ids) - 1) // 4 * 4
    unscoped = eng.generate([convo], GREEDY, namespace="acme")[0]
    assert unscoped.num_cached_tokens == 20
    assert eng.cache_stats().blocks_pinned == 5
    eng.check_integrity()


async def test_async_engine_passes_the_scope_to_the_cache() -> None:
    aeng = AsyncEngine.from_pretrained(
        tiny_model_dir(),
        block_size=4,
        kv_cache_bytes=kv_bytes(96, 4),
        device="cpu",
        dtype="float32",
    )
    async with aeng:
        convo = [*SYSTEM, *range(200, 220)]

        async def cached(user: str) -> int:
            outs = [
                o
                async for o in aeng.generate(
                    convo, GREEDY, namespace="acme", cache_scope=scope(user)
                )
            ]
            return outs[-1].num_cached_tokens

        assert await cached("a") == 0
        assert await cached("b") == 20  # only the shared blocks A computed
        assert await cached("a") == (len(convo) - 1) // 4 * 4
