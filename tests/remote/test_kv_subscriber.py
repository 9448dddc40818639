"""The KV-event subscriber over real ZMQ sockets on loopback, against a publisher speaking vLLM's
protocol (tests/remote/publisher.py): history at connect, gaps, losses, restarts, bind mode."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import zmq
import zmq.asyncio

from engine.remote.kv_events import AllCleared, BlockRemoved, EventBatch
from engine.remote.kv_subscriber import KVEventEndpoint, KVEventSubscriber
from tests.remote.publisher import Publisher, batch_map

WAIT_S = 20  # seconds  # generous: a loaded machine; every wait ends as soon as the batch is there


def removed(n: int) -> bytes:
    """A batch whose one event names ``n``: tells the batches apart."""
    return batch_map([{"type": "BlockRemoved", "block_hashes": [n], "medium": "GPU"}])


def label(batch: EventBatch) -> int | str:
    event = batch.events[0]
    if isinstance(event, AllCleared):
        return "cleared" if event.inferred else "server-cleared"
    assert isinstance(event, BlockRemoved)
    value = event.block_hashes[0]
    assert isinstance(value, int)
    return value


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture(params=[True, False], ids=["replay-0.32", "replay-older"])
async def publisher(
    ctx: zmq.asyncio.Context, request: pytest.FixtureRequest
) -> AsyncIterator[Publisher]:
    pub = Publisher(ctx, replay_topic=request.param)
    task = asyncio.create_task(pub.run_replay())
    yield pub
    task.cancel()
    pub.close()


class Reader:
    """The subscriber's stream pumped into a queue by a task, read with a deadline (a timed-out
    read must not cancel the stream itself)."""

    def __init__(self, sub: KVEventSubscriber) -> None:
        self.sub = sub
        self.queue: asyncio.Queue[EventBatch] = asyncio.Queue()
        self.task = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        async for batch in self.sub.batches():
            self.queue.put_nowait(batch)

    async def next(self, wait_s: float = WAIT_S) -> EventBatch:
        return await asyncio.wait_for(self.queue.get(), wait_s)

    async def until_live(self, pub: Publisher) -> list[int | str]:
        """Publish until a batch arrives live (the subscription has reached the publisher);
        the labels of everything read on the way."""
        seen: list[int | str] = []
        while True:
            n = await pub.publish(removed(1000 + pub.seq))
            try:
                while (batch := await self.next(0.2)).seq != n:
                    seen.append(label(batch))
            except TimeoutError:
                continue  # not subscribed yet: this one was dropped (a later replay may bring it)
            seen.append(label(batch))
            if not batch.replayed:
                return seen

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


@asynccontextmanager
async def reading(sub: KVEventSubscriber) -> AsyncIterator[tuple[KVEventSubscriber, Reader]]:
    """The subscriber open and read; both closed after."""
    async with sub:
        reader = Reader(sub)
        try:
            yield sub, reader
        finally:
            await reader.close()


def subscriber(pub: Publisher, **kwargs: object) -> KVEventSubscriber:
    ep = KVEventEndpoint("http://vllm-0", pub.endpoint, pub.replay_endpoint)
    return KVEventSubscriber(ep, context=kwargs.pop("context", None), **kwargs)  # type: ignore[arg-type]


async def test_history_before_connect_comes_by_replay_then_live_in_order(
    ctx: zmq.asyncio.Context, publisher: Publisher
) -> None:
    for n in range(3):
        await publisher.publish(removed(n))  # nobody listens yet: only the buffer keeps them
    async with reading(subscriber(publisher, context=ctx)) as (sub, reader):
        seen = [label(await reader.next()) for _ in range(3)]
        assert seen == [0, 1, 2]
        assert publisher.replay_requests[0] == 0
        seen += await reader.until_live(publisher)
        n = await publisher.publish(removed(77))
        last = await reader.next()
    assert (label(last), last.seq, last.replayed) == (77, n, False)
    assert seen == [0, 1, 2, *range(1003, 1003 + len(seen) - 3)]  # each once, in order
    assert last.source == "http://vllm-0" and sub.stats.duplicates >= 0


async def test_a_message_lost_on_the_way_is_fetched_from_the_replay_buffer(
    ctx: zmq.asyncio.Context, publisher: Publisher
) -> None:
    async with reading(subscriber(publisher, context=ctx, start_seq=None)) as (sub, reader):
        await reader.until_live(publisher)
        lost = await publisher.publish(removed(5), send=False)
        await publisher.publish(removed(6))
        first, second = await reader.next(), await reader.next()
    assert (label(first), first.seq, first.replayed) == (5, lost, True)
    assert (label(second), second.seq) == (6, lost + 1)
    assert sub.stats.gaps == 1 and sub.stats.lost == 0


async def test_a_message_the_buffer_dropped_clears_the_server(
    ctx: zmq.asyncio.Context, publisher: Publisher
) -> None:
    async with reading(subscriber(publisher, context=ctx, start_seq=None)) as (sub, reader):
        await reader.until_live(publisher)
        await publisher.publish(removed(5), send=False, keep=False)
        n = await publisher.publish(removed(6))
        seen = [(label(b), b.seq) for b in (await reader.next(), await reader.next())]
    assert seen == [("cleared", n), (6, n)]
    assert sub.stats.lost == 1


async def test_a_restarted_publisher_clears_the_server(
    ctx: zmq.asyncio.Context, publisher: Publisher
) -> None:
    async with reading(subscriber(publisher, context=ctx, start_seq=None)) as (sub, reader):
        await reader.until_live(publisher)
        publisher.restart()
        await publisher.publish(removed(50))  # seq 0 again
        seen = [(label(b), b.seq) for b in (await reader.next(), await reader.next())]
    assert seen == [("cleared", 0), (50, 0)]
    assert sub.stats.restarts == 1


async def test_resync_clears_and_replays_everything_buffered(
    ctx: zmq.asyncio.Context, publisher: Publisher
) -> None:
    async with reading(subscriber(publisher, context=ctx, start_seq=None)) as (sub, reader):
        await reader.until_live(publisher)
        buffered = [1000 + seq for seq in sorted(publisher.buffer)]
        sub.resync()
        seen = [label(await reader.next()) for _ in range(len(buffered) + 1)]
        await publisher.publish(removed(9))
        seen.append(label(await reader.next()))
    assert seen == ["cleared", *buffered, 9]
    assert publisher.replay_requests[-1] == 0


async def test_without_a_replay_endpoint_a_gap_is_a_loss(
    ctx: zmq.asyncio.Context, publisher: Publisher
) -> None:
    ep = KVEventEndpoint("s", publisher.endpoint)
    async with reading(KVEventSubscriber(ep, context=ctx, start_seq=None)) as (_, reader):
        await reader.until_live(publisher)
        await publisher.publish(removed(5), send=False)
        await publisher.publish(removed(6))
        seen = [label(await reader.next()), label(await reader.next())]
    assert seen == ["cleared", 6]


async def test_a_replay_socket_that_never_answers_times_out(ctx: zmq.asyncio.Context) -> None:
    pub = Publisher(ctx)  # its replay ROUTER is bound, but nobody answers it
    try:
        ep = KVEventEndpoint("s", pub.endpoint, pub.replay_endpoint)
        sub = KVEventSubscriber(ep, context=ctx, replay_timeout_s=0.3)
        async with reading(sub) as (_, reader):
            await reader.until_live(pub)
        assert sub.stats.replay_timeouts >= 1  # the replay asked for at connect
    finally:
        pub.close()


async def test_an_endpoint_with_a_star_binds_and_the_publisher_connects(
    ctx: zmq.asyncio.Context,
) -> None:
    ep = KVEventEndpoint("s", "tcp://127.0.0.1:*")
    async with reading(KVEventSubscriber(ep, context=ctx, start_seq=None)) as (sub, reader):
        assert sub.bound_endpoint.startswith("tcp://127.0.0.1:")
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.connect(sub.bound_endpoint)
        try:
            for seq in range(WAIT_S * 10):  # until the subscription has reached the publisher
                await pub.send_multipart([b"", seq.to_bytes(8, "big"), removed(seq)])
                try:
                    batch = await reader.next(0.1)
                    break
                except TimeoutError:
                    continue
        finally:
            pub.close(linger=0)
    assert label(batch) == batch.seq and not batch.replayed
