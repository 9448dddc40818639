"""One vLLM server's KV events as an async stream of typed batches (pyzmq; no torch).

``KVEventSubscriber`` holds three sockets::

    SUB     the publisher's messages [topic, seq, payload]; the endpoint is connected, or bound
            when it holds "*" (then the publisher, started with an endpoint without "*",
            connects to us: vLLM's rule, mirrored)
    DEALER  the publisher's replay ROUTER (always connected): ask [b"", start seq (8 bytes,
            big-endian)], answered per buffered message >= start with [b"", topic, seq, payload]
            (vLLM 0.32; earlier releases [b"", seq, payload]), then the same with seq -1
            (signed) and an empty payload
    PAIR    the SUB socket's monitor: each (re)connection triggers a replay from the next
            number not yet delivered, so what was published while we were away, or before we
            started (``start_seq``), is fetched even if the server then goes quiet

Sequence numbers decide what is delivered (``kv_sequence.py``). When events are lost for good
(the replay buffer dropped them, no replay endpoint, a malformed payload, a publisher restart),
the stream yields a batch with one ``AllCleared(inferred=True)`` first: a consumer that mirrors the
server's cache forgets the server and rebuilds from the events that follow (conservative: blocks
still cached but stored before are unknown to it until they are stored again).

A restart whose new counter has already passed ours while we were disconnected looks like a gap;
the owner that learns of a restart otherwise (``/health`` failed, then answered) calls
``resync()``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from engine.remote.kv_events import AllCleared, EventBatch, KVEventDecodeError, decode_batch
from engine.remote.kv_sequence import SequenceTracker, Take, Verdict

END_OF_REPLAY = -1
WAKE_MS = 1000  # the stream looks at resync() requests at least this often
_CONNECTED = zmq.EVENT_CONNECTED | zmq.EVENT_ACCEPTED


def replay_reply(frames: list[bytes]) -> tuple[int, bytes] | None:
    """(seq, payload) of one replay answer, either layout; None when malformed."""
    if len(frames) not in (3, 4) or frames[0] != b"" or len(frames[-2]) != 8:
        return None
    return int.from_bytes(frames[-2], "big", signed=True), frames[-1]


@dataclass(frozen=True, slots=True)
class KVEventEndpoint:
    """Where one server publishes. ``source``: its identity in the events (its base URL)."""

    source: str
    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""

    @property
    def binds(self) -> bool:
        return "*" in self.endpoint


@dataclass(slots=True)
class SubscriberStats:
    received: int = 0  # live messages
    delivered: int = 0  # batches yielded (live and replayed), inferred clears excluded
    replayed: int = 0  # of them, fetched from the replay socket
    duplicates: int = 0
    gaps: int = 0  # live messages that showed missing numbers
    lost: int = 0  # inferred AllCleared yielded (restarts included)
    restarts: int = 0
    malformed: int = 0
    unknown_events: int = 0
    replay_timeouts: int = 0


class KVEventSubscriber:
    """``async with KVEventSubscriber(ep) as sub: async for batch in sub.batches(): ...``"""

    def __init__(
        self,
        endpoint: KVEventEndpoint,
        *,
        start_seq: int | None = 0,
        replay_timeout_s: float = 2.0,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.stats = SubscriberStats()
        self._tracker = SequenceTracker(start_seq=start_seq)
        self._timeout_ms = max(1, int(replay_timeout_s * 1000))
        self._ctx = context or zmq.asyncio.Context.instance()
        self._sub: zmq.asyncio.Socket | None = None
        self._monitor: zmq.asyncio.Socket | None = None
        self._dealer: zmq.asyncio.Socket | None = None
        self._replay_due = False
        self._clear_due = False

    async def __aenter__(self) -> KVEventSubscriber:
        self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self.endpoint.topic.encode())
        self._monitor = sub.get_monitor_socket(_CONNECTED)
        if self.endpoint.binds:
            sub.bind(self.endpoint.endpoint)
        else:
            sub.connect(self.endpoint.endpoint)
        self._sub = sub

    @property
    def bound_endpoint(self) -> str:
        """The address the SUB socket bound (a "*" port resolved), for publishers to connect."""
        assert self._sub is not None and self.endpoint.binds, "a bound, open subscriber"
        value = self._sub.getsockopt(zmq.LAST_ENDPOINT)
        return value.decode() if isinstance(value, bytes) else str(value)

    def close(self) -> None:
        if self._sub is not None:
            self._sub.disable_monitor()
            self._sub.close(linger=0)
        for sock in (self._monitor, self._dealer):
            if sock is not None:
                sock.close(linger=0)
        self._sub = self._monitor = self._dealer = None

    def resync(self) -> None:
        """Forget what was delivered: the stream yields an inferred ``AllCleared``, then
        everything the publisher still buffers (replayed from 0), within ``WAKE_MS``."""
        self._tracker.restart()
        self._clear_due = self._replay_due = True

    async def batches(self) -> AsyncIterator[EventBatch]:
        """The server's batches in sequence order, forever (until the task is cancelled)."""
        assert self._sub is not None and self._monitor is not None, "open() first"
        poller = zmq.asyncio.Poller()
        poller.register(self._sub, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        while True:
            async for batch in self._due():
                yield batch
            ready = dict(await poller.poll(WAKE_MS))
            if self._monitor in ready:
                event = parse_monitor_message(await self._monitor.recv_multipart())
                self._replay_due = self._replay_due or bool(event["event"] & _CONNECTED)
            if self._sub in ready:
                async for batch in self._live(await self._sub.recv_multipart()):
                    yield batch

    async def _due(self) -> AsyncIterator[EventBatch]:
        """What ``resync`` or a (re)connection asked for, before anything else is judged."""
        if self._clear_due:
            self._clear_due = False
            yield self._cleared(self._tracker.wanted())
        if self._replay_due:
            self._replay_due = False
            async for batch in self._replay():
                yield batch

    async def _live(self, frames: list[bytes]) -> AsyncIterator[EventBatch]:
        self.stats.received += 1
        if len(frames) != 3 or len(frames[1]) != 8:
            self.stats.malformed += 1
            return
        _, seq_bytes, payload = frames
        async for batch in self._due():
            yield batch
        seq = int.from_bytes(seq_bytes, "big")
        verdict = self._tracker.on_live(seq)
        if verdict is Verdict.SKIP:
            self.stats.duplicates += 1
            return
        if verdict is Verdict.RESTART:
            self.stats.restarts += 1
            self.stats.lost += 1
            yield self._cleared(seq)
        if verdict is not Verdict.DELIVER and self._tracker.wanted() < seq:
            self.stats.gaps += verdict is Verdict.GAP
            async for batch in self._replay():
                yield batch
        async for batch in self._deliver(seq, payload, replayed=False):
            yield batch

    async def _deliver(
        self, seq: int, payload: bytes, *, replayed: bool
    ) -> AsyncIterator[EventBatch]:
        take = self._tracker.take(seq)
        if take is Take.DUPLICATE:
            self.stats.duplicates += 1
            return
        if take is Take.AFTER_LOSS:
            self.stats.lost += 1
            yield self._cleared(seq)
        try:
            batch = decode_batch(payload, source=self.endpoint.source, seq=seq, replayed=replayed)
        except KVEventDecodeError:
            self.stats.malformed += 1
            self.stats.lost += 1
            yield self._cleared(seq + 1)  # its events are unknown: so is the server's state
            return
        self.stats.delivered += 1
        self.stats.replayed += replayed
        self.stats.unknown_events += batch.skipped
        yield batch

    async def _replay(self) -> AsyncIterator[EventBatch]:
        """Everything the publisher still buffers from the next number on, in order."""
        tracker = self._tracker
        if self.endpoint.replay_endpoint is None or (tracker.next_seq is tracker.start_seq is None):
            return  # nothing to fetch from, or no history wanted before the first message
        dealer = self._replay_socket()
        await dealer.send_multipart([b"", tracker.wanted().to_bytes(8, "big")])
        while True:
            if not await dealer.poll(self._timeout_ms):  # POLLIN
                self.stats.replay_timeouts += 1
                dealer.close(linger=0)  # a late answer must not be read as the next one's
                self._dealer = None
                return
            reply = replay_reply(await dealer.recv_multipart())
            if reply is None:
                self.stats.malformed += 1
                continue
            seq, payload = reply
            if seq == END_OF_REPLAY:
                return
            async for batch in self._deliver(seq, payload, replayed=True):
                yield batch

    def _replay_socket(self) -> zmq.asyncio.Socket:
        if self._dealer is None:
            assert self.endpoint.replay_endpoint is not None
            dealer = self._ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(self.endpoint.replay_endpoint)
            self._dealer = dealer
        return self._dealer

    def _cleared(self, seq: int) -> EventBatch:
        """The inferred clear, numbered with the message from which knowledge resumes."""
        event = AllCleared(self.endpoint.source, inferred=True)
        return EventBatch(self.endpoint.source, seq, time.time(), (event,))
