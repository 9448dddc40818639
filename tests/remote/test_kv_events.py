"""vLLM's KV-event payloads, hand-built in both encodings vLLM has shipped, decoded."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.remote.kv_events import (
    AllCleared,
    BlockRemoved,
    BlockStored,
    KVEventDecodeError,
    decode_batch,
)
from engine.remote.kv_subscriber import replay_reply
from tests.remote.publisher import ENCODE, batch_array, batch_map, stored_map

H1, H2, H3 = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32
TOKENS = list(range(100, 116))


def test_a_map_batch_of_tagged_maps() -> None:
    events = [
        stored_map([H1, H2], None, TOKENS, 8),
        {"type": "BlockRemoved", "block_hashes": [H3], "medium": "GPU"},
        {"type": "AllBlocksCleared"},
    ]
    batch = decode_batch(batch_map(events, ts=12.5, rank=1), source="http://a", seq=7)
    assert (batch.source, batch.seq, batch.ts, batch.data_parallel_rank) == ("http://a", 7, 12.5, 1)
    assert batch.events == (
        BlockStored("http://a", (H1, H2), None, tuple(TOKENS), 8, None, "GPU"),
        BlockRemoved("http://a", (H3,), "GPU"),
        AllCleared("http://a"),
    )
    assert batch.skipped == 0 and not batch.replayed


def test_an_array_batch_of_tagged_maps_as_vllm_0_32_sends_it() -> None:
    event = stored_map([H1], None, TOKENS, 16, lora_name=None, extra_keys=[["salt-a"]])
    batch = decode_batch(batch_array([event], 3.25, 0), source="s", seq=2)
    expected = BlockStored("s", (H1,), None, tuple(TOKENS), 16, None, "GPU", cache_salt="salt-a")
    assert batch.events == (expected,)
    assert (batch.ts, batch.data_parallel_rank) == (3.25, 0)


def test_positional_arrays_of_older_releases_with_int_hashes() -> None:
    old = ["BlockStored", [11, 12], 10, TOKENS, 8, None]  # before "medium"
    newer = ["BlockStored", [13], 12, TOKENS[:8], 8, 3, "CPU", "lora-a", None]  # more trailing
    removed = ["BlockRemoved", [11]]
    batch = decode_batch(
        batch_array([old, newer, removed, ["AllBlocksCleared"]]), source="s", seq=0
    )
    assert batch.events == (
        BlockStored("s", (11, 12), 10, tuple(TOKENS), 8, None, None),
        BlockStored("s", (13,), 12, tuple(TOKENS[:8]), 8, 3, "CPU"),
        BlockRemoved("s", (11,), None),
        AllCleared("s"),
    )
    assert batch.data_parallel_rank is None
    ranked = decode_batch(batch_array([removed], 2.0, 4, "a future field"), source="s", seq=1)
    assert ranked.data_parallel_rank == 4 and ranked.events == (BlockRemoved("s", (11,)),)


def test_unknown_fields_are_ignored_and_unknown_events_skipped() -> None:
    extra = {"lora_name": None, "extra_keys": [["salt"]], "group_idx": 0, "kv_cache_spec_kind": "x"}
    events = [
        stored_map([H1], H2, TOKENS[:8], 8, **extra),
        {"type": "BlockMoved", "block_hashes": [H1], "to": "disk"},
    ]
    payload = ENCODE({"ts": 1.0, "events": events, "producer": "vllm-9", "data_parallel_rank": 0})
    batch = decode_batch(payload, source="s", seq=3)
    stored = BlockStored("s", (H1,), H2, tuple(TOKENS[:8]), 8, None, "GPU", cache_salt="salt")
    assert batch.events == (stored,)
    assert batch.skipped == 1
    arrays = decode_batch(
        batch_array([["BlockMoved", 1, 2], ["AllBlocksCleared", 9]]), source="s", seq=4
    )
    assert arrays.events == (AllCleared("s"),) and arrays.skipped == 1


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",  # never used in msgpack
        ENCODE("a string"),
        ENCODE({"events": []}),  # no ts
        batch_map([{"type": "BlockStored", "block_hashes": "not a list"}]),
        batch_map([stored_map([H1], None, ["a"], 8)]),  # token ids must be ints
        batch_array([["BlockRemoved"]]),  # hashes missing
        batch_map([42]),  # an event that is neither a map nor an array
    ],
)
def test_malformed_payloads_raise_one_error(payload: bytes) -> None:
    with pytest.raises(KVEventDecodeError):
        decode_batch(payload, source="s", seq=0)


def test_the_event_modules_import_no_torch() -> None:
    """The gateway decodes events without torch (the slim install)."""
    code = (
        "import sys, engine.remote.kv_events, engine.remote.kv_subscriber; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    ("frames", "expected"),
    [
        ([b"", b"", (5).to_bytes(8, "big"), b"p"], (5, b"p")),  # vLLM 0.32: topic first
        ([b"", (5).to_bytes(8, "big"), b"p"], (5, b"p")),  # earlier releases
        ([b"", b"", (-1).to_bytes(8, "big", signed=True), b""], (-1, b"")),  # end of replay
        ([b"x", (5).to_bytes(8, "big"), b"p"], None),  # no empty delimiter
        ([b"", b"\x05", b"p"], None),  # not 8 bytes
        ([b"", (5).to_bytes(8, "big")], None),  # no payload
    ],
)
def test_replay_answers_in_both_layouts(
    frames: list[bytes], expected: tuple[int, bytes] | None
) -> None:
    assert replay_reply(frames) == expected
