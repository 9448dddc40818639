"""``kvgate serve`` whose model cannot load: one line saying why, exit 1, nothing started.

A model the weight-free checks refuse (engine/runtime/model/checkpoint.py) is named before the
database is migrated, an admin token made or a worker started, and without importing torch: the
exit takes about as long as Python takes to read the settings. A model only loading refuses (a
tensor of the wrong shape) ends in the worker, with the worker's one line and the gateway's.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.runtime.model.demo import write_demo_model
from tests.e2e.servers import ServeProcess

# The check itself takes milliseconds; the rest is Python importing the settings (about a second
# on a quiet machine, several on a loaded one). The bound is generous so a busy test machine
# does not fail it; by construction (no torch import, asserted below) the exit stays this cheap.
EXIT_BOUND_S = 30.0


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


def _workers_for(model: Path) -> set[int]:
    found = set()
    for pid in _worker_pids():
        try:
            if str(model).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.add(pid)
        except OSError:
            continue
    return found


async def _run_to_exit(server: ServeProcess) -> float:
    """Start ``server``, wait for its exit; the seconds it ran."""
    started = time.monotonic()
    server.start()
    assert server.proc is not None
    try:
        async with asyncio.timeout(180):
            while server.proc.poll() is None:
                await asyncio.sleep(0.02)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
    return time.monotonic() - started


def _garbage_gguf(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "garbage.gguf"
    path.write_bytes(b"this is no model\n" * 64)
    return path, f"{path}: not a GGUF file"


def _missing(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "no-such-model"
    return path, f"{path}: model directory not found (nor a .gguf file)"


def _no_config(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "model-dir"
    path.mkdir()
    (path / "tokenizer.json").write_text("{}")
    return path, f"{path / 'config.json'}: file not found"


@pytest.mark.parametrize("make", [_garbage_gguf, _missing, _no_config])
async def test_a_model_that_does_not_load_is_named_before_anything_starts(
    tmp_path: Path, make: Callable[[Path], tuple[Path, str]]
) -> None:
    model, problem = make(tmp_path)
    # PYTHONPROFILEIMPORTTIME: every import the process made, on stderr ("import time: ...")
    env = {"KVGATE_MODEL": str(model), "PYTHONPROFILEIMPORTTIME": "1"}
    server = ServeProcess(tmp_path, env)
    took = await _run_to_exit(server)
    assert server.proc is not None
    out = server.read_output().splitlines()
    imports = [line for line in out if line.startswith("import time:")]
    said = [line for line in out if not line.startswith("import time:")]
    assert server.proc.returncode == 1, said
    assert said == [f"kvgate serve: the model does not load: {problem}"]
    assert not any(line.rstrip().endswith(("| torch", "| triton")) for line in imports)
    assert took < EXIT_BOUND_S, took
    var = tmp_path / "var"
    assert not (var / "kvgate.db").exists()  # no migration ran
    assert not (var / "admin-token.sha256").exists()  # no token made (and lost)
    assert _workers_for(model) == set()


async def test_a_model_only_loading_refuses_ends_with_the_workers_line(tmp_path: Path) -> None:
    """config.json promises a wider MLP than the weights hold: the checks pass (they read no
    tensor), the worker's load refuses it."""
    model = write_demo_model(tmp_path / "model")
    config = json.loads((model / "config.json").read_text())
    config["intermediate_size"] += 16
    (model / "config.json").write_text(json.dumps(config))
    server = ServeProcess(tmp_path, {"KVGATE_MODEL": str(model)})
    await _run_to_exit(server)
    assert server.proc is not None
    out = server.read_output()
    assert server.proc.returncode == 1, out
    assert "Traceback" not in out
    worker = [line for line in out.splitlines() if line.startswith("kvgate worker:")]
    assert len(worker) == 1 and "the model does not load:" in worker[0], out
    assert "has shape" in worker[0] and str(model) in worker[0]
    last = "kvgate serve: the local worker did not start (exit 1) (its message is above)"
    assert out.rstrip().endswith(last), out
    assert _workers_for(model) == set(), "worker processes left behind"
