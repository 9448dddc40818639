"""vLLM's KV-cache events, decoded into typed objects (no torch, no vLLM).

A vLLM server started with ``--kv-events-config`` publishes on a ZMQ PUB socket one message per
engine step that changed its prefix cache, three frames::

    [topic (bytes, "" by default), seq (8 bytes, big-endian, from 0 per publisher), payload]

The payload is msgpack: one batch ``(ts, events, data_parallel_rank)`` whose events are
``BlockStored``, ``BlockRemoved`` or ``AllBlocksCleared``, each tagged with its type name. vLLM
has shipped the batch and the events each as a positional array or as a map:

* vLLM 0.32: the batch an array, each event a map tagged by "type" ::

    [1.7e9, [{"type": "BlockStored", "block_hashes": [1376..., 7554...], "parent_block_hash": None,
              "token_ids": [...], "block_size": 128, "lora_id": None, "medium": "GPU",
              "lora_name": None, "extra_keys": [["<cache_salt>"], None]}], 0]

* earlier releases (and vLLM's example subscriber): all arrays, the tag first ::

    [1.7e9, [["BlockStored", [h1, h2], parent, [tok, ...], 16, lora_id, medium]], 0]

* and a batch as a map ``{"ts": ..., "events": [...], "data_parallel_rank": 0}``.

Each level is read as what its first msgpack byte says it is, and may carry more than we know:
unknown map keys and trailing array items are ignored, an event of an unknown type is skipped
(counted in ``EventBatch.skipped``), so a newer vLLM that adds fields or event kinds still decodes.
A block hash is an ``int`` on vLLM 0.32's wire (an unsigned 64-bit number) and ``bytes`` in some
releases (``ExternalBlockHash = bytes | int``); both are kept as sent. Anything else malformed
raises ``KVEventDecodeError`` for the whole message.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

BlockHash = bytes | int


class KVEventDecodeError(ValueError):
    """A KV-event payload that is not a batch of vLLM KV events."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks newly cached on ``source``: ``token_ids`` are the blocks' tokens in order
    (``block_size`` per hash); ``parent_block_hash`` is the block before the first one."""

    source: str
    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None  # "GPU" / "CPU" (vLLM's tier), None from older releases
    # the request's ``cache_salt`` where the first block carries it (vLLM 0.32's extra keys:
    # one entry per block; the salt is in the first block's, as it salts only that hash)
    cache_salt: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks evicted from ``source``'s cache (``medium``: the tier they left)."""

    source: str
    block_hashes: tuple[BlockHash, ...]
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class AllCleared:
    """Every block of ``source`` is gone. ``inferred``: the subscriber concluded it (the
    publisher restarted, or events were lost beyond what its replay buffer still held), not the
    server's own ``AllBlocksCleared``: what was known of the server no longer holds."""

    source: str
    inferred: bool = False


KVEvent = BlockStored | BlockRemoved | AllCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One published message: its sequence number, the publisher's timestamp and events."""

    source: str
    seq: int
    ts: float
    events: tuple[KVEvent, ...]
    data_parallel_rank: int | None = None
    skipped: int = 0  # events of a type this decoder does not know
    replayed: bool = False  # fetched from the replay socket, not received live


# -- the wire, as msgspec reads it (both encodings; defaults where older releases had less) ------


class _MapStored(msgspec.Struct, tag="BlockStored"):
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[object] | None = None


class _MapRemoved(msgspec.Struct, tag="BlockRemoved"):
    block_hashes: list[BlockHash]
    medium: str | None = None


class _MapCleared(msgspec.Struct, tag="AllBlocksCleared"):
    pass


class _ArrayStored(msgspec.Struct, array_like=True, tag="BlockStored"):
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[object] | None = None


class _ArrayRemoved(msgspec.Struct, array_like=True, tag="BlockRemoved"):
    block_hashes: list[BlockHash]
    medium: str | None = None


class _ArrayCleared(msgspec.Struct, array_like=True, tag="AllBlocksCleared"):
    pass


class _MapBatch(msgspec.Struct):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


class _ArrayBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


_Wire = _MapStored | _MapRemoved | _MapCleared | _ArrayStored | _ArrayRemoved | _ArrayCleared
_MAP_EVENT = msgspec.msgpack.Decoder(_MapStored | _MapRemoved | _MapCleared)
_ARRAY_EVENT = msgspec.msgpack.Decoder(_ArrayStored | _ArrayRemoved | _ArrayCleared)
_MAP_BATCH = msgspec.msgpack.Decoder(_MapBatch)
_ARRAY_BATCH = msgspec.msgpack.Decoder(_ArrayBatch)
_ANY = msgspec.msgpack.Decoder()
KNOWN_EVENTS = frozenset({"BlockStored", "BlockRemoved", "AllBlocksCleared"})


def _is_map(data: bytes) -> bool | None:
    """msgpack's first byte: True for a map, False for an array, None for anything else."""
    if not data:
        return None
    head = data[0]
    if 0x80 <= head <= 0x8F or head in (0xDE, 0xDF):
        return True
    if 0x90 <= head <= 0x9F or head in (0xDC, 0xDD):
        return False
    return None


def _tag_of(raw: bytes) -> object:
    """The event's type name as sent (the "type" key, or the first array item), or None."""
    try:
        value = _ANY.decode(raw)
    except msgspec.DecodeError:
        return None
    if isinstance(value, dict):
        return value.get("type")
    if isinstance(value, list) and value:
        return value[0]
    return None


def _event(raw: bytes, source: str) -> KVEvent | None:
    """One event; None for a type we do not know."""
    shape = _is_map(raw)
    if shape is None:
        raise KVEventDecodeError("an event is neither a map nor an array")
    try:
        wire: _Wire = (_MAP_EVENT if shape else _ARRAY_EVENT).decode(raw)
    except msgspec.ValidationError as exc:
        tag = _tag_of(raw)
        if isinstance(tag, str) and tag not in KNOWN_EVENTS:
            return None
        raise KVEventDecodeError(f"malformed {tag or 'event'}: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise KVEventDecodeError(f"malformed event: {exc}") from exc
    if isinstance(wire, _MapStored | _ArrayStored):
        return BlockStored(
            source,
            tuple(wire.block_hashes),
            wire.parent_block_hash,
            tuple(wire.token_ids),
            wire.block_size,
            wire.lora_id,
            wire.medium,
            _salt(wire.extra_keys, wire.lora_name),
        )
    if isinstance(wire, _MapRemoved | _ArrayRemoved):
        return BlockRemoved(source, tuple(wire.block_hashes), wire.medium)
    return AllCleared(source)


def _salt(extra_keys: list[object] | None, lora_name: str | None) -> str | None:
    """The cache salt among the first block's extra keys (in vLLM's order: the LoRA name, media
    pairs, the salt, prompt-embedding digests): its first string that is not the LoRA name."""
    first = extra_keys[0] if extra_keys else None
    if not isinstance(first, list):
        return None
    return next((k for k in first if isinstance(k, str) and k != lora_name), None)


def decode_batch(payload: bytes, *, source: str, seq: int, replayed: bool = False) -> EventBatch:
    """The message's payload as an ``EventBatch`` of ``source`` (the server's identity)."""
    shape = _is_map(payload)
    if shape is None:
        raise KVEventDecodeError("the payload is neither a msgpack map nor an array")
    try:
        batch = (_MAP_BATCH if shape else _ARRAY_BATCH).decode(payload)
    except msgspec.DecodeError as exc:  # ValidationError included
        raise KVEventDecodeError(f"malformed event batch: {exc}") from exc
    events: list[KVEvent] = []
    skipped = 0
    for raw in batch.events:
        event = _event(bytes(raw), source)
        if event is None:
            skipped += 1
        else:
            events.append(event)
    return EventBatch(
        source, seq, batch.ts, tuple(events), batch.data_parallel_rank, skipped, replayed
    )
