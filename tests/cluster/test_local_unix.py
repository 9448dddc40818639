"""The local worker's Unix domain socket: owner-only, authenticated, used for generate."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
from pathlib import Path

import aiohttp

from engine.api import GenerateOptions
from engine.params import SamplingParams
from gateway.cluster.client import WorkerClient
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
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        conn = aiohttp.UnixConnector(path=path)
        async with (
            aiohttp.ClientSession(connector=conn) as http,
            http.post("http://worker/v1/generate", data=b"{}") as r,
        ):
            assert r.status == 401  # the same token check as on TCP
        prompt = [(i * 31) % 1500 + 3 for i in range(40)]
        async with aiohttp.ClientSession() as http:
            tcp = WorkerClient(worker.url, TOKEN, http)
            unix = WorkerClient(worker.url, TOKEN, http, unix_path=path)
            want = [
                o
                async for o in tcp.generate(
                    prompt, GREEDY, GenerateOptions(namespace="u", request_id="a")
                )
            ]
            got = [
                o
                async for o in unix.generate(
                    prompt, GREEDY, GenerateOptions(namespace="u", request_id="b")
                )
            ]
            assert got[-1].token_ids == want[-1].token_ids and len(got[-1].token_ids) == 4
            # the pooled connection the stream went back to is the Unix socket's
            idle = unix._pool._idle
            assert len(idle) == 1
            assert idle[0].writer.get_extra_info("socket").family == socket.AF_UNIX
            unix.close()
            tcp.close()
    finally:
        await worker.stop()
    assert not os.path.exists(os.path.dirname(path or "/nonexistent"))
