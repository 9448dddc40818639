"""``kvgate bench gateway --only stages``: where a streamed request's time to first content goes.

The gateway of ``kvgate serve`` (``create_app(..., local_worker=True)``: the local worker over
its Unix socket, the in-process limiter) runs in this process, with timestamps taken around the
chat handler's steps (wrappers set on the module attributes the handler calls; nothing else
changes) and the worker's own clock readings of the request (``RequestMetrics``: arrival in the
worker, first scheduled step, first token; ``time.monotonic`` is one clock for every process on
the host). The client is a raw socket on the same loop. Printed and written: each stage's time
since the request was sent, median and minimum over the requests (the first few left out as
warm-up).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import engine.runtime  # noqa: F401  (first: the engine's process variables before torch loads)
from bench.gateway_ttft import RESULTS, Conversation, default_model, host

MARKS: dict[str, float] = {}
WARM = 5


def mark(name: str) -> None:
    MARKS.setdefault(name, time.monotonic())


def _timed(label: str, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        mark(f"{label}.in")
        result = await fn(*args, **kwargs)
        mark(f"{label}.out")
        return result

    return wrapper


def instrument() -> None:
    """Timestamps around the handler's steps (gateway/chat/views.py's names)."""
    from gateway.chat import generation, views

    views.prepare = _timed("prompt", views.prepare)  # type: ignore[assignment]
    views.admit = _timed("admit", views.admit)  # type: ignore[assignment]
    views.open_stream = _timed("headers", views.open_stream)  # type: ignore[assignment]
    send = views.send_event

    async def send_event(resp: Any, obj: dict[str, Any]) -> None:
        delta = (obj.get("choices") or [{}])[0].get("delta", {})
        kind = "role_chunk" if "role" in delta else "content_chunk" if delta.get("content") else ""
        if kind:
            mark(f"{kind}.in")
        await send(resp, obj)
        if kind:
            mark(f"{kind}.out")

    views.send_event = send_event  # type: ignore[assignment]
    start = generation.ChoiceGroup.start

    async def group_start(self: Any) -> None:
        mark("engine_call.in")
        await start(self)
        mark("engine_call.out")  # the first output is here (the worker's first token)
        m = self.choices[0]._first.metrics
        MARKS["worker.arrival"] = m.arrival_time
        MARKS["worker.first_step"] = m.first_scheduled_time
        MARKS["worker.first_token"] = m.first_token_time

    generation.ChoiceGroup.start = group_start  # type: ignore[method-assign]
    handler = views.chat_completions

    async def chat_completions(request: Any) -> Any:
        mark("handler.in")
        return await handler(request)

    views.chat_completions = chat_completions


async def _serve(model: Path, tmp: Path, convo: Conversation) -> tuple[Any, int, str]:
    """The gateway with its local worker on a loopback port, a tenant, its server key."""
    import aiohttp

    from bench.gateway_ttft import ADMIN_TOKEN, MODEL_NAME
    from gateway.app import create_app
    from gateway.http import make_runner
    from gateway.settings import Settings
    from tenants.migrate import upgrade_to_head

    db = f"sqlite+aiosqlite:///{tmp}/gateway.db"
    await upgrade_to_head(db)
    env = {
        "KVGATE_DATABASE_URL": db,
        "KVGATE_ADMIN_TOKEN": ADMIN_TOKEN,
        "KVGATE_VAR_DIR": str(tmp),
        "KVGATE_MODEL": str(model),
        "KVGATE_MODEL_NAME": MODEL_NAME,
        "KVGATE_LOG_LEVEL": "warning",
    }
    app = create_app(Settings.from_env(env), model_dir=str(model), local_worker=True)
    runner = make_runner(app, 10.0, 30.0, access_log=None)
    await runner.setup()
    await runner.listen_tcp("127.0.0.1", 0)
    port = runner.addresses[0][1]
    base, hdrs = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    limits = {"rpm": 10_000_000, "tpm": 1_000_000_000, "max_concurrency": 100}
    body = {"id": "bench", "name": "bench", "system_prompt": convo.system, "limits": limits}
    async with aiohttp.ClientSession(headers=hdrs) as http:
        async with http.post(f"{base}/admin/v1/tenants", json=body) as r:
            assert r.status == 201, await r.text()
        async with http.post(f"{base}/admin/v1/tenants/bench/keys", json={"kind": "server"}) as r:
            key = str((await r.json())["key"])
    return runner, port, key


async def _stream(port: int, key: str, content: str) -> float:
    """One streamed request on a fresh connection; ``MARKS['client.sent']`` is its start."""
    from bench.gateway_ttft import MODEL_NAME

    body = json.dumps(
        {
            "model": MODEL_NAME,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 2,
            "temperature": 0,
            "stream": True,
        }
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}"
        f"\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    t0 = MARKS["client.sent"] = time.monotonic()
    writer.write(head.encode() + body)
    buf = b""
    while b"[DONE]" not in buf:
        data = await reader.read(65536)
        if not data:
            break
        if b'"content"' in data:
            mark("client.content")
        buf += data
    writer.close()
    return t0


async def run(args: argparse.Namespace) -> dict[str, Any]:
    model = args.model or default_model()
    convo = Conversation.build(model, args.tenant_prompt)
    instrument()
    rows: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="kvgate-bench-stages-") as tmp:
        runner, port, key = await _serve(model, Path(tmp), convo)
        try:
            await asyncio.sleep(2)  # the tenant prompt pinned in the worker
            for i in range(args.requests + WARM):
                MARKS.clear()
                t0 = await _stream(port, key, convo.turn(i))
                row = {k: (v - t0) * 1e3 for k, v in MARKS.items() if v is not None}
                row["worker.first_step_to_token"] = (
                    row["worker.first_token"] - row["worker.first_step"]
                )
                rows.append(row)
                await asyncio.sleep(0.2)  # the request's clean-up done before the next
        finally:
            await runner.cleanup()
    rows = rows[WARM:]
    order = sorted(rows[-1], key=lambda k: statistics.median(r[k] for r in rows))
    stages = {
        k: {"p50_ms": statistics.median(r[k] for r in rows), "min_ms": min(r[k] for r in rows)}
        for k in order
    }
    config = {
        "benchmark": "gateway --only stages",
        "model": model.name,
        "tenant_prompt_tokens": len(convo.prefix_ids),
        "turn_tokens": len(convo.prompt_ids(0)) - len(convo.prefix_ids),
        "requests": len(rows),
        "gateway": "create_app(local_worker=True) in this process (kvgate serve's shape)",
        "client": "raw socket on the same event loop, a connection per request",
        "times": "ms since the request was sent; worker.* from the worker's RequestMetrics",
        **host(),
    }
    return {"config": config, "stages": stages}


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="kvgate bench gateway --only stages", description=__doc__)
    p.add_argument("--only", choices=("stages",), default="stages")
    p.add_argument("--model", type=Path, help="HF dir or .gguf (default: the default model)")
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--tenant-prompt", type=int, default=760)
    p.add_argument("--out", type=Path, default=RESULTS / "gateway-ttft-stages.json")
    args = p.parse_args(list(argv))
    out = asyncio.run(run(args))
    for name, s in out["stages"].items():
        print(f"{name:36s} p50 {s['p50_ms']:8.2f} ms   min {s['min_ms']:8.2f} ms")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0
