"""The engine opens when the app starts: an engine that cannot open fails start-up with a
message saying why, after closing what was opened before it, and leaves no worker process."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from engine.text.errors import ModelLoadError
from gateway.app import create_app
from gateway.cluster import local
from gateway.cluster.bootstrap import ClusterUnavailable
from gateway.cluster.local import LocalWorkerError
from gateway.context import STATE
from gateway.settings import ModelSettings
from tests.gateway.harness import make_settings
from tests.gateway.lifecycle.test_create_app import _children


async def start(app: web.Application) -> web.AppRunner:
    runner = web.AppRunner(app)
    await runner.setup()  # runs cleanup_ctx: the engine opens here
    return runner


async def test_a_local_worker_that_cannot_load_its_model_fails_start_up(
    gateway_database: str, tmp_path: Path
) -> None:
    empty = tmp_path / "no-model"
    empty.mkdir()
    before = _children()
    app = create_app(
        make_settings(gateway_database, tmp_path), model_dir=str(empty), local_worker=True
    )
    with pytest.raises(LocalWorkerError, match="the local worker did not start"):
        await start(app)
    assert _children() == before  # the worker exited (and was reaped): none is left behind


async def test_workers_that_never_answer_fail_start_up(
    gateway_database: str, tmp_path: Path
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        port = silent.getsockname()[1]
        settings = make_settings(
            gateway_database,
            tmp_path,
            KVGATE_WORKERS=f"http://127.0.0.1:{port}",
            KVGATE_WORKER_TOKEN="t" * 32,
            KVGATE_WORKER_CONNECT_TIMEOUT_S="1",
        )
        app = create_app(settings)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(ClusterUnavailable, match="no worker answered in 1 s"):
            await start(app)
        # polled without blocking the loop, within the timeout plus one request's own timeout
        assert loop.time() - started < 1 + 5 + 2


async def test_a_model_that_cannot_load_in_process_fails_start_up(
    gateway_database: str, tmp_path: Path
) -> None:
    app = create_app(make_settings(gateway_database, tmp_path), model_dir=str(tmp_path / "nope"))
    with pytest.raises(ModelLoadError, match="model directory not found"):
        await start(app)


async def test_the_model_loads_off_the_event_loop(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The load waits for a signal that only the running event loop can give: on the loop's
    own thread (or before it runs) it would wait in vain."""
    signal, seen = threading.Event(), []
    real = local.load_in_process

    def load(model: ModelSettings, model_dir: str) -> Any:
        seen.append(signal.wait(timeout=10.0))
        return real(model, model_dir)

    monkeypatch.setattr(local, "load_in_process", load)
    app = create_app(make_settings(gateway_database, tmp_path), model_dir=str(demo_model_dir))
    assert seen == []  # building the app loads nothing

    async def give_signal() -> None:
        while not seen:
            signal.set()
            await asyncio.sleep(0.01)

    signaller = asyncio.create_task(give_signal())
    runner = await start(app)
    try:
        assert seen == [True]
        assert app[STATE].engine.is_running
    finally:
        signaller.cancel()
        await runner.cleanup()
