"""The local worker's Unix domain socket (its probes and transport on a path): owner-only,
authenticated, used for generate."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import aiohttp
import pytest

from engine.api import GenerateOptions
from engine.params import SamplingParams
from engine.remote import messages as m
from engine.remote.channel import WorkerChannel, WorkerUnavailable
from engine.remote.client import WorkerClient
from gateway.cluster.local import LocalWorker
from tests.cluster.workers import TOKEN, worker_env

GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


async def test_local_worker_streams_generate_over_its_unix_socket(demo_model_dir: Path) -> None:
    worker = await asyncio.to_thread(
        LocalWorker.start, str(demo_model_dir), 120, token=TOKEN, env=worker_env(), unix=True
    )
    path = worker.unix_path
    try:
        assert path is not None
        prompt = [(i * 31) % 1500 + 3 for i in range(40)]
        async with aiohttp.ClientSession() as http:
            tcp = WorkerClient(worker.url, TOKEN, http)
            unix = WorkerClient(worker.url, TOKEN, http, unix_path=path)
            want = [o async for o in tcp.generate(prompt, GREEDY, GenerateOptions("u", "a"))]
            got = [o async for o in unix.generate(prompt, GREEDY, GenerateOptions("u", "b"))]
            assert got[-1].token_ids == want[-1].token_ids and len(got[-1].token_ids) == 4
            # calls go over the Unix socket (owner-only): a channel whose URL leads nowhere
            # is served through it
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
            nowhere = "http://127.0.0.1:9"
            only_unix = WorkerChannel(nowhere, TOKEN, unix_path=path, connect_s=5.0)
            assert isinstance(await only_unix.request(m.Load, 5.0), m.Loaded)
            await only_unix.close()
            # the same token check as on TCP: another token is not admitted
            other = WorkerChannel(nowhere, "another-token-0123456789abcdef00", unix_path=path)
            with pytest.raises(WorkerUnavailable, match="upgrade refused"):
                await other.request(m.Load, 2.0)
            await other.close()
            await unix.close()
            await tcp.close()
    finally:
        await worker.stop()
    assert not os.path.exists(os.path.dirname(path or "/nonexistent"))
