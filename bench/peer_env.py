"""A benchmark peer's own Python environment (llama.cpp, vLLM): never a kvgate dependency."""

from __future__ import annotations

import subprocess
import venv
from collections.abc import Callable, Mapping
from pathlib import Path


def peer_python(
    root: Path,
    module: str,
    install: Callable[[list[str]], None],
    what: str,
) -> Path:
    """``root``'s interpreter once it imports ``module``: the environment is created there and
    ``install(pip command)`` run into it the first time (``what`` says so; minutes)."""
    python = root / "bin" / "python"
    probe = [str(python), "-c", f"import {module}"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    print(f"{what} into {root} (once; minutes)", flush=True)
    venv.create(root, with_pip=True)
    install([str(python), "-m", "pip"])
    return python


def pip_run(env: Mapping[str, str] | None = None) -> Callable[[list[str]], None]:
    """``run(command)``: a pip command that must succeed."""

    def run(command: list[str]) -> None:
        subprocess.run(command, check=True, env=env)

    return run
