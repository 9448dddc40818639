"""A benchmark peer's own Python environment (llama.cpp, vLLM): never a kvgate dependency."""

from __future__ import annotations

import subprocess
import venv
from collections.abc import Mapping, Sequence
from pathlib import Path


def peer_python(
    root: Path,
    module: str,
    pip_steps: Sequence[Sequence[str]],
    what: str,
    env: Mapping[str, str] | None = None,
) -> Path:
    """``root``'s interpreter once it imports ``module``: the first time the environment is
    created there and each of ``pip_steps`` (pip's arguments) run in it, which must succeed
    (``what`` says so; minutes)."""
    python = root / "bin" / "python"
    probe = [str(python), "-c", f"import {module}"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    print(f"{what} into {root} (once; minutes)", flush=True)
    venv.create(root, with_pip=True)
    for step in pip_steps:
        subprocess.run([str(python), "-m", "pip", *step], check=True, env=env)
    return python
