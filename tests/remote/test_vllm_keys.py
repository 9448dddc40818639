"""vLLM's KV events in the gateway's block keys (engine/remote/vllm_keys.py): a chain of stored
blocks is keyed as the gateway's index keys the same prompt under the same salt."""

from __future__ import annotations

from engine.core.kv.hashing import root_key
from engine.remote.keys import reusable_block_keys
from engine.remote.kv_events import AllCleared, BlockRemoved, BlockStored, decode_batch
from engine.remote.messages import Removed, Stored, Tiered
from engine.remote.vllm_keys import VllmKeyMap
from engine.remote.vllm_wire import vllm_salt
from gateway.cluster.kvindex import KvIndex
from tests.remote.publisher import batch_array, stored_map

BS = 4
SRC = "http://vllm-a"
PROMPT = list(range(100, 100 + 3 * BS + 1))  # three full blocks and one token


def stored(
    hashes: list[int], parent: int | None, tokens: list[int], salt: str | None
) -> BlockStored:
    return BlockStored(SRC, tuple(hashes), parent, tuple(tokens), BS, None, "GPU", salt)


def test_a_stored_chain_gets_the_keys_the_index_computes_for_the_prompt() -> None:
    m = VllmKeyMap(BS)
    # one event with the first two blocks, then one chained on the second
    out = m.translate([stored([11, 12], None, PROMPT[: 2 * BS], "salt-a")])
    out += m.translate([stored([13], 12, PROMPT[2 * BS : 3 * BS], None)])
    expected = [k.hex() for k in reusable_block_keys("salt-a", PROMPT, BS)]
    assert [e.key for e in out if isinstance(e, Stored)] == expected
    assert out[0].parent == root_key("salt-a").hex() and out[1].parent == expected[0]
    index = KvIndex()
    index.apply("a", out)
    assert index.longest("salt-a", PROMPT, BS) == (3, frozenset({"a"}))
    assert index.longest("salt-b", PROMPT, BS) == (0, frozenset())  # another tenant's salt


def test_removed_and_cleared_blocks_leave_the_index() -> None:
    m = VllmKeyMap(BS)
    index = KvIndex()
    index.apply("a", m.translate([stored([11, 12, 13], None, PROMPT[: 3 * BS], "s")]))
    removed = m.translate([BlockRemoved(SRC, (13, 99), "GPU")])  # 99: never seen, ignored
    assert removed == [Removed(reusable_block_keys("s", PROMPT, BS)[2].hex())]
    index.apply("a", removed)
    assert index.longest("s", PROMPT, BS)[0] == 2
    index.apply("a", m.translate([AllCleared(SRC, inferred=True)]))
    assert index.longest("s", PROMPT, BS)[0] == 0 and len(m) == 0
    index.check_integrity()


def test_blocks_it_cannot_key_are_skipped() -> None:
    m = VllmKeyMap(BS)
    assert m.translate([stored([21], None, PROMPT[:BS], None)]) == []  # unsalted: not ours
    assert m.translate([stored([22], 77, PROMPT[:BS], None)]) == []  # parent never seen
    assert m.translate([stored([23, 24], None, PROMPT[:BS], "s")]) == []  # tokens short
    assert m.skipped == 4 and len(m) == 0


def test_blocks_in_another_medium_are_the_host_tier() -> None:
    m = VllmKeyMap(BS)
    e = BlockStored(SRC, (31,), None, tuple(PROMPT[:BS]), BS, None, "CPU", "s")
    key = reusable_block_keys("s", PROMPT, BS)[0].hex()
    assert m.translate([e]) == [Tiered(key, "host")]
    assert m.translate([BlockRemoved(SRC, (31,), "CPU")]) == [Tiered(key, None)]


def test_the_salt_is_read_from_the_first_blocks_extra_keys() -> None:
    """As vLLM 0.32 publishes it: one extra-keys entry per block, the salt in the first."""
    event = stored_map([1, 2], None, PROMPT[: 2 * BS], BS, lora_name=None)
    event["extra_keys"] = [["tenant-salt"], None]
    (decoded,) = decode_batch(batch_array([event]), source=SRC, seq=0).events
    assert isinstance(decoded, BlockStored) and decoded.cache_salt == "tenant-salt"
    lora = stored_map([1], None, PROMPT[:BS], BS, lora_name="ad")
    lora["extra_keys"] = [["ad", "tenant-salt"]]
    (decoded,) = decode_batch(batch_array([lora]), source=SRC, seq=1).events
    assert isinstance(decoded, BlockStored) and decoded.cache_salt == "tenant-salt"
    bare = stored_map([1], 5, PROMPT[:BS], BS)
    (decoded,) = decode_batch(batch_array([bare]), source=SRC, seq=2).events
    assert isinstance(decoded, BlockStored) and decoded.cache_salt is None


def test_the_salt_of_a_request() -> None:
    from engine.api import CacheScope

    assert vllm_salt("ns", None) == "ns"
    # a scope sharing the tenant prefix: vLLM cannot keep the tail private, the tenant's salt
    assert vllm_salt("ns", CacheScope(b"\x01\x02", 40)) == "ns"
    # a per-visitor scope (no shared token): the whole prompt under the visitor's salt
    assert vllm_salt("ns", CacheScope(b"\x01\x02", 0)) == "ns/0102"
