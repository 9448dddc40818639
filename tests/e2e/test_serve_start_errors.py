"""``kvgate serve`` whose engine cannot open: one message saying why, exit 1, no worker left."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.e2e.servers import ServeProcess


def _worker_pids() -> set[int]:
    """Processes running a local worker (``kvgate worker ... --exit-with-stdin``)."""
    out: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"worker" in cmd and b"--exit-with-stdin" in cmd:
            out.add(int(entry.name))
    return out


async def test_a_model_that_does_not_load_ends_serve_with_the_workers_message(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "no-such-model"
    server = ServeProcess(tmp_path, {"KVGATE_MODEL": str(missing)})
    server.start()
    assert server.proc is not None
    try:
        async with asyncio.timeout(120):
            while server.proc.poll() is None:
                await asyncio.sleep(0.1)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
    out = server.read_output()
    assert server.proc.returncode == 1, out
    assert "kvgate serve: the local worker did not start (exit 1):" in out
    assert str(missing) in out  # the worker's own report (its stderr), naming the model path
    # the gateway's part is that one message, at the end: no traceback of its own
    assert out.rstrip().endswith("kvgate serve: the local worker did not start (exit 1):")
    assert "LocalWorkerError" not in out
    mine = {
        pid
        for pid in _worker_pids()
        if str(missing).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    }
    assert mine == set(), f"worker processes left behind: {mine}"
