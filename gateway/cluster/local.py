"""The launcher: every way the gateway's code starts an engine, and the one gateway module that
imports the engine below its boundary (tests/test_import_graph.py names it).

    LocalWorker         the one local worker ``kvgate serve`` starts when ``KVGATE_WORKERS`` is
                        unset: ``kvgate worker`` in a child process
    run_worker          ``kvgate worker`` itself: the engine behind the worker transport
    load_in_process     the engine in this process, on a thread (tests, benchmarks, a gateway
                        given only a model directory)
    write_demo_model    the demo model's random weights (``kvgate serve`` offline)

Each needs the engine extra (torch): ``engine_missing`` says so in one line where it is not
installed (``pip install kvgate`` is the gateway alone, ``pip install "kvgate[engine]"`` adds it).

The local worker is a child process on a free loopback port, with a fresh random token, the
parent's environment (so every ``KVGATE_*`` engine setting applies) and its standard input on a
pipe: when the gateway process ends, however it ends, the pipe closes and the worker stops.
With ``unix=True`` it also listens on a Unix domain socket in a private temporary directory
(``unix_path``): where the gateway makes its calls (the message transport).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.api import EngineClient
from engine.remote.messages import READY_PREFIX

if TYPE_CHECKING:
    from gateway.settings import ModelSettings

ENGINE_EXTRA = "kvgate[engine]"


class LocalWorkerError(RuntimeError):
    """The local worker did not start (its output is in the message)."""


def engine_missing() -> str | None:
    """Why this install cannot run an engine (one line), or None when it can."""
    try:
        found = importlib.util.find_spec("torch") is not None
    except ImportError:  # a broken install (or a finder that refuses it) counts as none
        found = False
    return None if found else f"the engine is not installed: pip install '{ENGINE_EXTRA}'"


def check_local_model(model_dir: str, dtype: str) -> None:
    """The loaders' own weight-free checks of the model a local engine is to load (headers,
    metadata, files present; torch-free): their ``ModelLoadError`` before anything starts."""
    from engine.runtime.model.checkpoint import check_model

    check_model(model_dir, dtype)


def load_in_process(model: ModelSettings, model_dir: str) -> EngineClient:
    """The model's engine in this process (seconds to minutes: call it off the event loop)."""
    from engine.serving.async_engine import AsyncEngine

    return AsyncEngine.from_pretrained(model_dir, **model.engine_overrides())


def run_worker(
    model_dir: str,
    token: str,
    worker_id: str,
    overrides: dict[str, Any],
    *,
    host: str,
    port: int,
    exit_with_stdin: bool,
    unix_path: str | None,
) -> None:
    """``kvgate worker``: load the model and serve it until stopped (``ModelLoadError`` for
    what only loading finds)."""
    from engine.serving.worker.main import build_app, serve_worker

    app = build_app(model_dir, token, worker_id, **overrides)
    asyncio.run(serve_worker(app, host, port, exit_with_stdin=exit_with_stdin, unix_path=unix_path))


def write_demo_model(path: Path) -> Path:
    """The demo model (random weights, deterministic) written to ``path``."""
    from engine.runtime.model.demo import write_demo_model as write

    return write(path)


class LocalWorker:
    def __init__(
        self, proc: subprocess.Popen[bytes], url: str, token: str, unix_path: str | None = None
    ) -> None:
        self.proc = proc
        self.url = url
        self.token = token
        self.unix_path = unix_path

    @classmethod
    def start(
        cls,
        model_dir: str,
        timeout_s: float = 300.0,
        *,
        worker_id: str | None = None,
        token: str | None = None,
        env: dict[str, str] | None = None,
        unix: bool = False,
    ) -> LocalWorker:
        """Start the worker and wait until it listens (it loads the model first)."""
        token = token or secrets.token_urlsafe(32)
        env = {**(os.environ if env is None else env), "KVGATE_WORKER_TOKEN": token}
        cmd = [sys.executable, "-m", "gateway.cli", "worker", "--host", "127.0.0.1", "--port",
               "0", "--model", model_dir, "--exit-with-stdin"]  # fmt: skip
        if worker_id is not None:
            cmd += ["--id", worker_id]
        unix_path = None
        if unix:
            unix_path = os.path.join(tempfile.mkdtemp(prefix="kvgate-worker-"), "worker.sock")
            cmd += ["--unix", unix_path]
        proc = subprocess.Popen(
            cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None
        )
        try:
            url = _read_ready(proc, timeout_s)
        except LocalWorkerError:
            _remove_socket_dir(unix_path)
            raise
        return cls(proc, url, token, unix_path)

    @classmethod
    def start_many(
        cls, model_dir: str, ids: list[str], token: str, env: dict[str, str], timeout_s: float
    ) -> list[LocalWorker]:
        """Start workers ``ids`` in parallel (each imports torch and loads the model)."""
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(len(ids)) as pool:
            futures = [
                pool.submit(cls.start, model_dir, timeout_s, worker_id=w, token=token, env=env)
                for w in ids
            ]
            return [f.result() for f in futures]

    async def stop(self, timeout_s: float = 10.0) -> None:
        proc = self.proc
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.terminate()
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        _remove_socket_dir(self.unix_path)


def _remove_socket_dir(unix_path: str | None) -> None:
    if unix_path is not None:
        shutil.rmtree(os.path.dirname(unix_path), ignore_errors=True)


def _read_ready(proc: subprocess.Popen[bytes], timeout_s: float) -> str:
    lines: list[str] = []
    found: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            if line.startswith(READY_PREFIX):
                found.append(line[len(READY_PREFIX) :])
                return
            lines.append(line)

    reader = threading.Thread(target=read, name="kvgate-local-worker", daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not found:
        proc.kill()
        proc.wait()
        # The worker's own errors went to this process's stderr (inherited), before this line.
        tail = "\n".join(lines[-20:])
        said = f":\n{tail}" if tail else " (its message is above)"
        raise LocalWorkerError(f"the local worker did not start (exit {proc.returncode}){said}")
    # Keep draining stdout so the worker never blocks on a full pipe.
    threading.Thread(target=_drain, args=(proc,), daemon=True).start()
    return found[0]


def _drain(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdout is not None
    with contextlib.suppress(Exception):
        for _ in proc.stdout:
            pass
