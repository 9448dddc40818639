"""AsyncEngine on the real runner: streaming, abort, cancellation, overload, pins, shutdown."""

from __future__ import annotations

import asyncio
import threading

import pytest

from engine import AsyncEngine, Engine
from engine.core.kv import PriorityRange
from engine.errors import (
    EngineClosed,
    EngineDead,
    EngineOverloaded,
    PinRejected,
    PromptTooLong,
    RequestAborted,
)
from engine.outputs import RequestOutput
from engine.params import SamplingParams
from tests.engine._logits import assert_logprobs_close
from tests.engine._tiny_model import kv_bytes, tiny_model_dir

PROMPT = [11, 22, 33, 44, 55, 66, 77, 88, 99]


def make_async(num_blocks: int = 256, **overrides: object) -> AsyncEngine:
    """float32 (``dtype=auto`` is bf16 on a CPU with bf16 units): these tests compare tokens
    across batches and cache states, which the float32 path computes bitwise."""
    return AsyncEngine.from_pretrained(
        tiny_model_dir(),
        block_size=4,
        kv_cache_bytes=kv_bytes(num_blocks, 4),
        device="cpu",
        dtype="float32",
        **overrides,
    )


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


async def collect(
    aeng: AsyncEngine, prompt: list[int], n: int, **kw: object
) -> list[RequestOutput]:
    return [out async for out in aeng.generate(prompt, greedy(n), **kw)]


async def wait_idle(aeng: AsyncEngine) -> None:
    for _ in range(500):
        stats = aeng.cache_stats()
        if stats.blocks_in_use == 0 and not aeng._core.has_work():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("engine did not go idle")


async def test_streams_deltas_matching_the_sync_engine() -> None:
    sync = Engine.from_pretrained(
        tiny_model_dir(), block_size=4, kv_cache_bytes=kv_bytes(64, 4), dtype="float32"
    )
    expected = [sync.generate([PROMPT[: 5 + i]], greedy(8))[0].token_ids for i in range(3)]
    threads_before = threading.active_count()
    async with make_async() as aeng:
        results = await asyncio.gather(*(collect(aeng, PROMPT[: 5 + i], 8) for i in range(3)))
        for outs, want in zip(results, expected, strict=True):
            assert tuple(t for o in outs for t in o.new_token_ids) == want
            assert outs[-1].finished and outs[-1].finish_reason == "length"
            assert all(not o.finished for o in outs[:-1]) and len(outs) == 8
            assert outs[-1].metrics.ttft is not None and outs[-1].metrics.ttft >= 0
        # same prompt again: served from the prefix cache
        again = await collect(aeng, PROMPT[:7], 8, namespace="default")
        assert again[-1].num_cached_tokens == 4
        assert aeng.num_model_tokens > 0
    assert not aeng.is_running and threading.active_count() == threads_before


async def test_abort_by_id_ends_the_stream_and_frees_blocks() -> None:
    async with make_async() as aeng:
        outs: list[RequestOutput] = []
        async for out in aeng.generate(PROMPT, greedy(500), request_id="r1"):
            outs.append(out)
            if len(outs) == 3:
                await aeng.abort("r1")
        assert outs[-1].finished and outs[-1].finish_reason == "abort"
        assert 3 <= len(outs[-1].token_ids) < 500
        await wait_idle(aeng)


async def test_consumer_leaving_or_cancelled_aborts_the_request() -> None:
    async with make_async() as aeng:
        async for _ in aeng.generate(PROMPT, greedy(500), request_id="left"):
            break  # leaving the loop; the generator is closed below
        await aeng.generate(PROMPT, greedy(1)).aclose()  # never started: nothing queued
        gen = aeng.generate(PROMPT, greedy(500), request_id="cancelled")

        async def consume() -> None:
            async for _ in gen:
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0)
        await wait_idle(aeng)
        assert aeng.cache_stats().blocks_in_use == 0


async def test_bounded_waiting_queue_refuses_with_overloaded() -> None:
    async with make_async(max_num_seqs=1, max_waiting=2) as aeng:
        first = aeng.generate(PROMPT, greedy(400), request_id="long")
        await first.__anext__()  # running now: the next requests must wait
        waiting = [aeng.generate(PROMPT[:6], greedy(2), request_id=f"w{i}") for i in range(2)]
        tasks = [asyncio.create_task(g.__anext__()) for g in waiting]
        await asyncio.sleep(0.05)
        with pytest.raises(EngineOverloaded):
            await aeng.generate(PROMPT[:5], greedy(2)).__anext__()
        await first.aclose()  # aborts the long request; the waiting ones run
        firsts = await asyncio.gather(*tasks)
        assert all(o.request_id in ("w0", "w1") for o in firsts)
        for g in waiting:
            await g.aclose()


async def test_prompt_too_long_and_duplicate_ids() -> None:
    async with make_async(num_blocks=8) as aeng:
        with pytest.raises(PromptTooLong):
            await aeng.generate([5] * 40, greedy(4)).__anext__()  # 43 KV tokens > 32
        gen = aeng.generate(PROMPT, greedy(20), request_id="dup")
        await gen.__anext__()
        with pytest.raises(ValueError):
            await aeng.generate(PROMPT, greedy(3), request_id="dup").__anext__()
        await gen.aclose()


async def test_pin_prefix_and_unpin() -> None:
    async with make_async() as aeng:
        system = [7] * 3 + list(range(100, 118))  # 21 tokens: 5 full blocks
        handle = await aeng.pin_prefix("acme", system)
        assert handle.num_tokens == 20
        assert aeng.cache_stats().blocks_pinned == 5
        outs = await collect(aeng, [*system, 1, 2], 3, namespace="acme")
        assert outs[-1].num_cached_tokens == 20
        await aeng.unpin(handle)
        await asyncio.sleep(0.02)
        assert aeng.cache_stats().blocks_pinned == 0
        with pytest.raises(PinRejected):
            await aeng.pin_prefix("acme", [1, 2])


async def test_shutdown_ends_streams_and_refuses_new_work() -> None:
    aeng = make_async()
    await aeng.start()
    gen = aeng.generate(PROMPT, greedy(10_000 // 20), request_id="x")
    await gen.__anext__()
    stop = asyncio.create_task(aeng.shutdown())
    with pytest.raises(RequestAborted):
        async for _ in gen:
            pass
    await stop
    assert not aeng.is_running
    assert aeng.cache_stats().blocks_in_use == 0  # the stats show what the shutdown freed
    with pytest.raises(EngineClosed):
        await aeng.generate(PROMPT, greedy(2)).__anext__()


async def test_event_loop_keeps_ticking_and_bad_priorities_are_refused() -> None:
    async with make_async() as aeng:
        with pytest.raises(ValueError):
            await aeng.generate(
                PROMPT, greedy(2), priorities=[PriorityRange(0, 4, 101)]
            ).__anext__()
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.001)
                ticks += 1

        task = asyncio.create_task(ticker())
        outs = await collect(aeng, PROMPT, 64, priorities=[PriorityRange(0, 8, 90)])
        task.cancel()
        assert len(outs) == 64 and outs[-1].finish_reason == "length"
        assert ticks > 0, "the event loop must run while the engine computes"


async def test_request_id_reused_right_after_its_stream_was_left() -> None:
    async with make_async() as aeng:
        first = aeng.generate(PROMPT, greedy(50), request_id="same")
        await anext(first)
        await first.aclose()  # queues the abort of the first request
        # Reused at once: the first request's abort output must not end this stream.
        outs = await collect(aeng, PROMPT, 6, request_id="same")
        assert outs[-1].finish_reason == "length" and len(outs[-1].token_ids) == 6
        await wait_idle(aeng)


async def test_token_id_outside_the_vocabulary_is_refused_and_the_engine_keeps_serving() -> None:
    async with make_async() as aeng:
        vocab = aeng._core.vocab_size
        for bad in ([*PROMPT, vocab], [-1, *PROMPT]):
            with pytest.raises(ValueError, match="token ids must lie in"):
                await collect(aeng, bad, 3)
        outs = await collect(aeng, PROMPT, 3)
        assert outs[-1].finish_reason == "length" and aeng.is_running


async def test_pin_sent_as_the_engine_loop_dies_fails_instead_of_waiting_forever() -> None:
    async with make_async() as aeng:

        def broken(batch: object) -> list[int | None]:
            raise RuntimeError("device lost")

        aeng._core.runner.execute = broken  # type: ignore[method-assign]
        with pytest.raises(EngineDead):
            await collect(aeng, PROMPT, 3)
        assert aeng._thread is not None
        aeng._thread.join(5)
        # The race: pin_prefix saw the loop alive just before the thread recorded its failure and
        # drained the inbox; the command lands where nobody reads it. The thread's last act,
        # _fail_all, is posted to the event loop and runs after that command was sent.
        aeng._fatal = None
        task = asyncio.create_task(aeng.pin_prefix("t", PROMPT))
        await asyncio.sleep(0)
        aeng._fail_all(EngineDead("engine loop stopped"))
        with pytest.raises(EngineDead):
            await asyncio.wait_for(task, 5)


async def test_without_interim_outputs_only_the_first_and_the_final_are_posted() -> None:
    logprobs = SamplingParams(max_tokens=7, temperature=0.0, ignore_eos=True, logprobs=2)
    async with make_async() as aeng:
        every = [o async for o in aeng.generate(PROMPT, logprobs)]
        ends = [o async for o in aeng.generate(PROMPT, logprobs, interim=False)]
        aborted: list[RequestOutput] = []
        async for out in aeng.generate(PROMPT, greedy(500), request_id="a", interim=False):
            aborted.append(out)
            await aeng.abort("a")
    assert len(every) == 7 and len(ends) == 2
    first, final = ends
    assert first.new_token_ids == every[0].new_token_ids and not first.finished
    assert final.token_ids == every[-1].token_ids and final.finish_reason == "length"
    # the final delta folds every step after the first, logprob entries with their tokens
    assert first.new_token_ids + final.new_token_ids == final.token_ids
    assert final.new_logprobs is not None
    assert [lp.token_id for lp in final.new_logprobs] == list(final.new_token_ids)
    # The second request reads the first one's prompt blocks from the prefix cache: its last
    # prompt token goes through other attention ops, so the logprobs agree within a tolerance,
    # not bitwise (docs/contracts.md, "Determinism"); the tokens agree exactly.
    want = [lp for o in every[1:] for lp in o.new_logprobs or ()]
    assert first.num_cached_tokens == 8
    assert_logprobs_close(final.new_logprobs, want)
    # an abort is the final output: it still carries the tokens since the first
    assert len(aborted) == 2 and aborted[-1].finish_reason == "abort"
    assert aborted[0].new_token_ids + aborted[-1].new_token_ids == aborted[-1].token_ids
