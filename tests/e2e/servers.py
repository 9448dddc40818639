"""``kvgate serve`` as a real OS process on a free loopback port."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from tests.gateway.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]
KVGATE = [sys.executable, "-c", "import sys; from gateway.cli import main; sys.exit(main())"]
# Small, fast engine for tests; everything else comes from the caller's env.
BASE_ENV = {
    "KVGATE_DEVICE": "cpu",
    "KVGATE_KV_CACHE_BYTES": str(8 << 20),
    "KVGATE_DEFAULT_MAX_TOKENS": "4",
    "KVGATE_DEFAULT_MODEL": "demo",  # hermetic: no download of the default model
    "KVGATE_SHUTDOWN_TIMEOUT_S": "3",
    "KVGATE_METRICS_PORT": "0",  # no metrics listener unless a test asks (one port per process)
    "KVGATE_KV_SNAPSHOT_DIR": "off",  # no pinned-prompt snapshots unless a test asks
    "OMP_NUM_THREADS": "1",
}


class ServeProcess:
    """``kvgate serve`` of this checkout, or with ``kvgate`` (a command line) that one as it is
    (an installed ``kvgate``: nothing is imported from the checkout, no PYTHONPATH)."""

    def __init__(self, cwd: Path, env: dict[str, str], kvgate: list[str] | None = None) -> None:
        self.port = free_port()
        self.cwd = cwd
        self.kvgate = KVGATE if kvgate is None else kvgate
        drop = ("KVGATE_", "OTEL_", "PYTHONPATH")
        clean = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
        source = {"PYTHONPATH": str(ROOT)} if kvgate is None else {}
        self.env = {**clean, **source, **BASE_ENV, **env}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = cwd / f"serve-{self.port}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        cmd = [*self.kvgate, "serve", "--host", "127.0.0.1", "--port", str(self.port)]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                cmd, cwd=self.cwd, env=self.env, stdout=out, stderr=subprocess.STDOUT
            )

    def read_output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    async def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < deadline:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise AssertionError(f"kvgate serve exited:\n{self.read_output()}")
                try:
                    async with http.get(f"{self.url}/readyz") as resp:
                        if resp.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
        raise AssertionError(f"kvgate serve not ready:\n{self.read_output()}")

    def admin_token(self) -> str | None:
        m = re.search(r"admin token \(shown once, keep it\): (\S+)", self.read_output())
        return m.group(1) if m else None

    async def stop(self, timeout: float = 15.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"kvgate serve ignored SIGTERM:\n{self.read_output()}")
            await asyncio.sleep(0.05)
        return self.proc.returncode


# ``kvgate serve`` as the console script runs it, with torch and Triton made unimportable first
# (a finder ahead of every other refuses them, as an install without them would).
NO_TORCH = """
import sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("torch", "triton"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoTorch())
from gateway.cli import main
sys.exit(main())
"""


class SlimServe(ServeProcess):
    """``kvgate serve`` as the slim install runs it: torch and Triton cannot be imported."""

    def start(self) -> None:
        cmd = [sys.executable, "-c", NO_TORCH, "serve", "--host", "127.0.0.1"]
        cmd += ["--port", str(self.port)]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                cmd, cwd=self.cwd, env=self.env, stdout=out, stderr=subprocess.STDOUT
            )
