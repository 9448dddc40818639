"""Host KV tier on the real runner (tiny random model, CPU, float32): a prompt served from host
blocks gives the logits (<= 1e-5) and greedy tokens of a fresh computation."""

from __future__ import annotations

import pytest
import torch

from engine import Engine
from tests.engine._tiny_model import GREEDY, first_logits, kv_bytes, prompt, tiny_model_dir


def make_engine(num_blocks: int, block_size: int, host_blocks: int = 0, **kw: object) -> Engine:
    return Engine.from_pretrained(
        tiny_model_dir(),
        block_size=block_size,
        kv_cache_bytes=kv_bytes(num_blocks, block_size),
        host_kv_bytes=kv_bytes(host_blocks, block_size),
        device="cpu",
        dtype="float32",
        **kw,
    )


def pool_blocks(num_tokens: int, block_size: int) -> int:
    return -(-(num_tokens + GREEDY.max_tokens) // block_size) + 2


@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_prompt_served_from_host_blocks_equals_fresh_computation(block_size: int) -> None:
    ids = prompt(1)
    fresh = make_engine(pool_blocks(len(ids), block_size), block_size, enable_prefix_reuse=False)
    want_logits, want_tokens = first_logits(fresh, ids, "t")

    n = pool_blocks(len(ids), block_size)
    eng = make_engine(n, block_size, host_blocks=2 * n)
    eng.generate([ids], GREEDY, namespace="t")
    full = (len(ids) - 1) // block_size
    assert eng.cache.evict(n) >= full  # out of the device: offloaded
    eng.core.flush_transfers()
    assert eng.cache_stats().host_blocks_cached >= full
    # the device pool is reused by another tenant in between (restored blocks land elsewhere)
    eng.generate([prompt(2)], GREEDY, namespace="other")
    got_logits, got_tokens = first_logits(eng, ids, "t")
    stats = eng.cache_stats()
    assert stats.host_hit_tokens == full * block_size
    assert stats.blocks_restored == full
    assert got_tokens == want_tokens
    assert torch.allclose(got_logits, want_logits, atol=1e-5, rtol=0)
    eng.check_integrity()


def test_pin_beyond_the_device_cap_is_restored_from_the_host() -> None:
    bs = 16
    a, b = prompt(3, 64), prompt(4, 64)
    eng = make_engine(16, bs, host_blocks=16, pin_cap_fraction=0.25)  # device cap: 4 blocks
    assert eng.pin_prefix("a", a).tier == "device"
    hb = eng.pin_prefix("b", b)
    assert hb.tier == "host" and eng.cache_stats().host_blocks_pinned == 4
    eng.core.flush_transfers()
    for i in range(3):  # device pressure: b's unpinned device blocks are evicted
        eng.generate([prompt(10 + i, 150)], GREEDY, namespace=f"x{i}")
    assert eng.cache.lookup("b", [*b, 1]).num_tokens == 0
    want = make_engine(16, bs, enable_prefix_reuse=False).generate([[*b, 1]], GREEDY)[0]
    got = eng.generate([[*b, 1]], GREEDY, namespace="b")[0]
    assert got.num_cached_tokens == 64 and got.token_ids == want.token_ids
    eng.unpin(hb)
    assert eng.cache_stats().host_blocks_pinned == 0
    eng.check_integrity()


def _kv(num_blocks: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(num_blocks, 4, 2, 8, generator=g),
            torch.randn(num_blocks, 4, 2, 8, generator=g),
        )
        for _ in range(3)
    ]


@pytest.mark.parametrize("staged", [False, True], ids=["cpu", "staged"])
def test_host_pool_copies_follow_plan_order(staged: bool) -> None:
    """Both copy paths (CPU index copies; the CUDA path's staged per-block copies) move whole
    blocks of every layer, in plan order: a slot reused within one plan ends with the later
    block, a restore from a slot reads it before a later offload overwrites it."""
    from engine.core.kv.transfers import Direction, Transfer, TransferPlan
    from engine.runtime.tiers.host_pool import HostKVPool, read_blocks, write_blocks

    kv = _kv(6, seed=0)
    want = {b: read_blocks(kv, [b])[0].clone() for b in range(6)}
    pool = HostKVPool(kv, 4)
    out, into = Direction.OUT, Direction.IN
    plan = TransferPlan(
        (
            Transfer(out, 0, 0), Transfer(out, 1, 1), Transfer(out, 2, 0),  # slot 0 reused: 2
            Transfer(into, 5, 1),  # block 5 <- slot 1 (block 1's K/V)
            Transfer(out, 3, 1),  # slot 1 overwritten after it was read
        )
    )  # fmt: skip
    run = pool.run_staged if staged else pool.run
    run(kv, plan)
    assert torch.equal(pool.data[0], want[2]) and torch.equal(pool.data[1], want[3])
    assert torch.equal(read_blocks(kv, [5])[0], want[1])
    write_blocks(kv, [4], want[0][None])
    assert torch.equal(read_blocks(kv, [4])[0], want[0])
    assert pool.block_bytes == want[0].numel() * 4
