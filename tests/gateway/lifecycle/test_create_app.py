"""``create_app`` builds objects only: it reads no model, starts no process, connects nowhere.

Watched two ways at once: Python's audit events (PEP 578: every ``open``, every process start,
every socket ``connect``, in any thread) and the kernel's view (this process's children, a
listening socket's accept queue). Each test ends with a positive control: the watch sees the
very thing it watches for when it is done on purpose, so a watch that saw nothing was looking.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gateway.app import create_app
from gateway.context import STATE
from tests.gateway.harness import make_settings

_WATCHED = ("open", "subprocess.Popen", "os.posix_spawn", "os.fork", "os.exec", "socket.connect")
_recording: list[list[tuple[str, tuple[Any, ...]]]] = []  # the open watches (audit hooks stay)


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if _recording and event in _WATCHED:
        for events in _recording:
            events.append((event, args))


sys.addaudithook(_hook)


def _children() -> set[int]:
    """Live child processes of this process (every thread's), from /proc."""
    out: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            out |= {int(pid) for pid in (task / "children").read_text().split()}
    return out


@contextlib.contextmanager
def watch() -> Iterator[list[tuple[str, tuple[Any, ...]]]]:
    events: list[tuple[str, tuple[Any, ...]]] = []
    _recording.append(events)
    try:
        yield events
    finally:
        _recording.remove(events)


def opened_under(events: list[tuple[str, tuple[Any, ...]]], root: Path) -> list[str]:
    paths = [str(args[0]) for name, args in events if name == "open" and args]
    return [p for p in paths if os.path.realpath(p).startswith(str(root.resolve()))]


def started(events: list[tuple[str, tuple[Any, ...]]]) -> list[str]:
    return [name for name, _ in events if name != "open" and not name.startswith("socket.")]


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}"


def test_create_app_with_a_model_dir_does_not_read_the_model(
    demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(sqlite_url(tmp_path), tmp_path)
    before = _children()
    with watch() as events:
        app = create_app(settings, model_dir=str(demo_model_dir))
    assert opened_under(events, demo_model_dir) == [], "create_app read the model"
    assert started(events) == [] and _children() == before
    assert STATE not in app  # the running state exists only once cleanup_ctx ran
    with watch() as control:
        (demo_model_dir / "config.json").read_bytes()
    assert opened_under(control, demo_model_dir) == [str(demo_model_dir / "config.json")]


def test_create_app_with_a_local_worker_starts_no_process(
    demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(sqlite_url(tmp_path), tmp_path)
    before = _children()
    with watch() as events:
        create_app(settings, model_dir=str(demo_model_dir), local_worker=True)
    assert started(events) == [], "create_app started a process"
    assert _children() == before
    assert opened_under(events, demo_model_dir) == []
    with watch() as control:
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert "subprocess.Popen" in started(control)


def test_create_app_with_workers_connects_to_none(demo_model_dir: Path, tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as worker:  # a "worker" that never answers
        worker.setblocking(False)
        port = worker.getsockname()[1]
        settings = make_settings(
            sqlite_url(tmp_path),
            tmp_path,
            KVGATE_WORKERS=f"http://127.0.0.1:{port}",
            KVGATE_WORKER_TOKEN="t" * 32,
            KVGATE_WORKER_CONNECT_TIMEOUT_S="1",
        )
        with watch() as events:
            create_app(settings)
        assert [args for name, args in events if name == "socket.connect"] == []
        try:  # the kernel queues a connection even when nobody accepts it
            worker.accept()[0].close()
            raise AssertionError("create_app connected to the worker")
        except BlockingIOError:
            pass
        with watch() as control, socket.create_connection(("127.0.0.1", port)):
            pass
        assert any(name == "socket.connect" for name, _ in control)
        worker.accept()[0].close()  # the control's connection is there: the check can fail
