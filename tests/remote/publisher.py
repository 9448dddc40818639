"""Hand-built KV-event messages, and a publisher that speaks vLLM's wire protocol on loopback.

The publisher is for what a real vLLM server cannot be made to do on demand (drop a live message,
forget its replay buffer, restart its counter); tests/vllm checks the subscriber against a real
server. Protocol (vLLM's ``--kv-events-config`` publisher): PUB sends [topic, seq (8 bytes,
big-endian), msgpack batch]; a ROUTER answers [id, b"", start seq] with [id, b"", topic, seq,
payload] for every buffered seq >= start, then [id, b"", topic, -1 (8 bytes, signed), b""] (before
vLLM 0.32 without the topic frame).
"""

from __future__ import annotations

from typing import Any

import msgspec
import zmq
import zmq.asyncio

ENCODE = msgspec.msgpack.encode
END = (-1).to_bytes(8, "big", signed=True)


def stored_map(hashes: list[Any], parent: Any, tokens: list[int], size: int, **extra: Any) -> Any:
    """A BlockStored event as vLLM 0.32 sends it: a map tagged by "type"."""
    event = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent}
    event.update(token_ids=tokens, block_size=size, lora_id=None, medium="GPU", **extra)
    return event


def batch_map(events: list[Any], ts: float = 1.5, rank: int | None = 0) -> bytes:
    body: dict[str, Any] = {"ts": ts, "events": events}
    if rank is not None:
        body["data_parallel_rank"] = rank
    return ENCODE(body)


def batch_array(events: list[Any], ts: float = 1.5, *rest: Any) -> bytes:
    return ENCODE([ts, events, *rest])


class Publisher:
    """PUB + replay ROUTER on loopback ports (asyncio sockets); ``publish`` numbers, buffers and
    sends; ``run_replay`` answers replay requests until cancelled, recording where each asked
    to start."""

    def __init__(self, ctx: zmq.asyncio.Context, *, replay_topic: bool = True) -> None:
        self.replay_topic = replay_topic  # vLLM 0.32 puts the topic before the number
        self.pub = ctx.socket(zmq.PUB)
        self.router = ctx.socket(zmq.ROUTER)
        for sock in (self.pub, self.router):
            sock.setsockopt(zmq.LINGER, 0)
        self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.replay_port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.buffer: dict[int, bytes] = {}
        self.seq = 0
        self.replay_requests: list[int] = []

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_port}"

    async def publish(self, payload: bytes, *, send: bool = True, keep: bool = True) -> int:
        """Number the payload; ``send=False``: buffer it only (as if lost on the way),
        ``keep=False``: send it but not into the buffer (as if the buffer had dropped it)."""
        seq, self.seq = self.seq, self.seq + 1
        if keep:
            self.buffer[seq] = payload
        if send:
            await self.pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])
        return seq

    async def run_replay(self) -> None:
        while True:
            ident, _, start = await self.router.recv_multipart()
            first = int.from_bytes(start, "big")
            self.replay_requests.append(first)
            head = [ident, b"", b""] if self.replay_topic else [ident, b""]
            for seq in sorted(s for s in self.buffer if s >= first):
                await self.router.send_multipart([*head, seq.to_bytes(8, "big"), self.buffer[seq]])
            await self.router.send_multipart([*head, END, b""])

    def restart(self) -> None:
        """A new publisher process: counter and buffer from zero, same ports."""
        self.seq = 0
        self.buffer.clear()

    def close(self) -> None:
        self.pub.close(linger=0)
        self.router.close(linger=0)
