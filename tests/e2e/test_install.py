"""A regular install, as ``ops/Dockerfile`` makes it (``pip install .``), serves.

The wheel is built from the checkout's files (what a clone holds, nothing left over from an
editable install) and must hold every file of the packages but the few named in
``NOT_INSTALLED``; a list of run-time reads would go stale, this comparison cannot. Then the
wheel is installed into a fresh virtual environment outside the checkout and its own
``kvgate serve`` must answer the widget script, the icon, the console page and a chat completion.

Nothing is downloaded: the wheel is built without build isolation (this environment's
setuptools), installed without its dependencies, and the new environment finds them through a
``.pth`` line naming this environment's site-packages (a plain path: that directory's own
``.pth`` files, the editable install of the checkout among them, are not run).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import aiohttp
import pytest
from openai import AsyncOpenAI

from tests.e2e.servers import ROOT, ServeProcess
from tests.e2e.test_serve import admin

PACKAGES = ("engine", "gateway", "tenants", "migrations", "bench")  # pyproject: packages.find
BUILD_FILES = ("pyproject.toml", "README.md")  # what setuptools reads besides the packages
# Checkout files under the packages that no installed code reads (each must exist: a stale
# entry fails the test too).
NOT_INSTALLED = {
    "bench/results/": "benchmark outputs: `kvgate bench` writes them, nothing reads them",
    "bench/gpu_check.sh": "a script run from a checkout (`bash bench/gpu_check.sh`)",
}
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check"]


def package_files() -> list[str]:
    """The packages' files in this checkout: tracked ones and new ones git does not ignore."""
    cmd = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--"]
    out = subprocess.run([*cmd, *PACKAGES], cwd=ROOT, capture_output=True, check=True).stdout
    names = {n for n in out.decode().split("\0") if n}
    return sorted(n for n in names if (ROOT / n).is_file())  # deleted, not yet committed


def installed(name: str) -> bool:
    return not any(name.startswith(prefix) for prefix in NOT_INSTALLED)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel ``pip install .`` builds, from a copy of the checkout's files."""
    src = tmp_path_factory.mktemp("src")
    for name in [*BUILD_FILES, *package_files()]:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("wheel")
    build = [*PIP, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
    subprocess.run([*build, "-w", str(out), str(src)], check=True, capture_output=True)
    (found,) = out.glob("kvgate-*.whl")
    return found


def test_the_wheel_holds_every_file_of_the_packages(wheel: Path) -> None:
    files = package_files()
    for prefix in NOT_INSTALLED:
        assert any(n.startswith(prefix) for n in files), f"stale NOT_INSTALLED entry {prefix}"
    with zipfile.ZipFile(wheel) as zf:
        held = {n for n in zf.namelist() if not n.split("/")[0].endswith(".dist-info")}
    expected = {n for n in files if installed(n)}
    assert expected - held == set(), "left out of the wheel: add them to package-data"
    assert held - expected == set(), "in the wheel, not in the packages"


def new_environment(where: Path, wheel: Path) -> Path:
    """A virtual environment at ``where`` with ``wheel`` installed; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    install = [*PIP, "--python", str(python), "install", "--no-deps", "--no-index", "-q"]
    subprocess.run([*install, str(wheel)], check=True, capture_output=True)
    paths = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    (Path(site) / "kvgate-test-dependencies.pth").write_text("\n".join(sorted(paths)) + "\n")
    return python


def imported_from(python: Path, server: ServeProcess) -> list[str]:
    """Where ``python`` imports the packages from, in the server's directory and environment."""
    code = "import engine, gateway, migrations, tenants as t; print(gateway.__file__)"
    code += "; print(engine.__file__); print(migrations.__file__); print(t.__file__)"
    run = subprocess.run(
        [str(python), "-c", code], cwd=server.cwd, env=server.env,
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return run.stdout.split()


@pytest.mark.timeout(300)
async def test_kvgate_serve_from_a_regular_install(wheel: Path, tmp_path: Path) -> None:
    assert not tmp_path.resolve().is_relative_to(ROOT)  # nothing found through the cwd
    venv = tmp_path / "venv"
    python = new_environment(venv, wheel)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    server = ServeProcess(run_dir, {}, kvgate=[str(venv / "bin" / "kvgate")])
    for path in imported_from(python, server):
        assert Path(path).is_relative_to(venv), path
    server.start()
    try:
        await server.wait_ready()
        token = server.admin_token()
        assert token, server.read_output()
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{server.url}/widget/v1/kvgate-chat.js") as resp:
                assert resp.status == 200
                script = ROOT / "gateway" / "widget" / "static" / "kvgate-chat.js"
                assert await resp.read() == script.read_bytes()
            async with http.get(f"{server.url}/favicon.ico") as resp:
                assert resp.status == 200
                icon = ROOT / "gateway" / "static" / "favicon.ico"
                assert await resp.read() == icon.read_bytes()
            async with http.get(f"{server.url}/admin/ui/") as resp:
                assert resp.status == 200
                page = ROOT / "gateway" / "admin" / "ui" / "index.html"
                assert await resp.read() == page.read_bytes()
            body = {"id": "installed", "name": "Installed", "system_prompt": "Be brief."}
            await admin(http, server.url, token, "/tenants", body)
            key = await admin(
                http, server.url, token, "/tenants/installed/keys", {"kind": "server"}
            )
        async with AsyncOpenAI(base_url=f"{server.url}/v1", api_key=key["key"], max_retries=0) as c:
            resp = await c.chat.completions.create(
                model="demo-model", messages=[{"role": "user", "content": "hi"}]
            )
            assert resp.choices[0].message.content is not None
            assert resp.usage is not None and resp.usage.completion_tokens >= 1
        assert await server.stop() == 0
    finally:
        if server.proc and server.proc.poll() is None:
            server.proc.kill()
