"""``kvgate bench tools``: a tool loop the gateway runs vs the same loop run by a stateless client.

Side by side in one run, turn by turn interleaved (machine noise hits both alike), on one
gateway on loopback with a webhook receiver on loopback (answers at once, or after ``--tool-ms``):

    gateway   the tenant's tool has a webhook source: one request; the gateway calls the tool,
              appends the result and continues, ``--rounds`` rounds, then a text step
    client    the same tool without a source (another tenant, same prompt): the client gets
              ``tool_calls``, calls the same webhook itself, sends the whole conversation back
              (assistant turn with the calls + the ``tool`` message), ``--rounds`` rounds, then
              a request with ``tool_choice: "none"``

Both force the call (a named ``tool_choice``) and decode greedily, so the model writes the same
calls and each turn has the same number of steps. Reported per mode (medians over repeats, with
the min-max spread): the turn's time with the tool latency taken out (the webhook's time as each
side measured it), prefill tokens per step after the first (``prompt_tokens - cached_tokens``:
what each continuation computed), and for the gateway the time it spends itself per round
(``kvgate_steps[].gateway_ms``: parsing the calls, building the next prompt, submitting it; tool
and engine time excluded). Random-weight demo model unless ``--model``; CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench.common import print_table, summarize, write_json

RESULTS = Path(__file__).resolve().parent / "results"
ADMIN = "bench-admin-token-0123456789"
SYSTEM = "You are the order desk of Example Corp. Look orders up before you answer. " * 4
PARAMS = {
    "type": "object",
    "properties": {"order_id": {"type": "integer", "minimum": 1, "maximum": 99}},
    "required": ["order_id"],
    "additionalProperties": False,
}
NAMED = {"type": "function", "function": {"name": "lookup_order"}}


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvgate bench tools", description=__doc__)
    p.add_argument("--turns", type=int, default=8, help="turns per mode and repeat")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2, help="tool rounds per turn")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--tool-ms", type=float, default=0.0, help="the webhook's own latency")
    p.add_argument("--model", help="model directory (default: the demo model, written to tmp)")
    p.add_argument("--out", type=Path, default=RESULTS / "tools.json")
    return p.parse_args(list(argv))


def _receiver(delay_s: float) -> web.Application:
    async def lookup(request: web.Request) -> web.Response:
        body = await request.json()
        await asyncio.sleep(delay_s)
        args = body["arguments"]
        return web.json_response({"order_id": args.get("order_id"), "status": "shipped"})

    app = web.Application()
    app.router.add_post("/lookup", lookup)
    return app


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


class Bench:
    def __init__(self, http: aiohttp.ClientSession, url: str, hook: str, args: Any) -> None:
        self.http, self.url, self.hook, self.args = http, url, hook, args
        self.model = ""

    async def admin(self, method: str, path: str, body: Any = None) -> Any:
        headers = {"Authorization": f"Bearer {ADMIN}"}
        async with self.http.request(
            method, f"{self.url}/admin/v1{path}", json=body, headers=headers
        ) as r:
            assert r.status < 300, await r.text()
            return await r.json()

    async def tenant(self, tid: str, source: bool) -> str:
        limits = {"rpm": 10**7, "tpm": 10**9, "max_concurrency": 100, "max_output_tokens": 400}
        await self.admin("POST", "/tenants", {"id": tid, "name": tid, "limits": limits})
        tool: dict[str, Any] = {
            "type": "function",
            "function": {
                "name": "lookup_order",
                "description": "Look an order up",
                "parameters": PARAMS,
            },
        }
        if source:
            tool["source"] = {"webhook": f"{self.hook}/lookup"}
        version = {
            "text": SYSTEM,
            "tools": [tool],
            "max_tool_rounds": self.args.rounds,
            "tool_choice": NAMED,
        }
        await self.admin("PUT", f"/tenants/{tid}/system-prompt", version)
        key = await self.admin("POST", f"/tenants/{tid}/keys", {"kind": "server"})
        for _ in range(500):
            if (await self.admin("GET", f"/tenants/{tid}/cache"))["pin_state"] == "pinned":
                break
            await asyncio.sleep(0.01)
        return str(key["key"])

    async def chat(self, key: str, messages: list[dict[str, Any]], **extra: Any) -> Any:
        body = {
            "model": self.model,
            "messages": messages,
            "temperature": 0.0,
            "max_tokens": self.args.max_tokens,
            **extra,
        }
        headers = {"Authorization": f"Bearer {key}"}
        async with self.http.post(
            f"{self.url}/v1/chat/completions", json=body, headers=headers
        ) as r:
            assert r.status == 200, await r.text()
            return await r.json()

    async def gateway_turn(self, key: str, ask: str) -> dict[str, Any]:
        t0 = time.perf_counter()
        out = await self.chat(key, [{"role": "user", "content": ask}])
        total = time.perf_counter() - t0
        runs, steps = out["kvgate_tool_runs"], out["kvgate_steps"]
        tool_s = sum(
            max(r["duration_ms"] for r in runs if r["round"] == k) / 1000
            for k in {r["round"] for r in runs}
        )
        return {
            "excl_tools_s": total - tool_s,
            "rounds": len({r["round"] for r in runs}),
            "prefill": [s["prompt_tokens"] - s["cached_tokens"] for s in steps[1:]],
            "gateway_ms": [s["gateway_ms"] for s in steps[1:]],
        }

    async def client_turn(self, key: str, ask: str) -> dict[str, Any]:
        messages: list[dict[str, Any]] = [{"role": "user", "content": ask}]
        prefill: list[int] = []
        tool_s, rounds = 0.0, 0
        t0 = time.perf_counter()
        for k in range(self.args.rounds + 1):
            choice = NAMED if k < self.args.rounds else "none"
            out = await self.chat(key, messages, tool_choice=choice)
            if k:
                usage = out["usage"]
                prefill.append(
                    usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"]
                )
            message = out["choices"][0]["message"]
            if not message.get("tool_calls"):
                break
            rounds += 1
            messages.append(
                {"role": "assistant", "content": None, "tool_calls": message["tool_calls"]}
            )
            for call in message["tool_calls"]:
                t1 = time.perf_counter()
                args = json.loads(call["function"]["arguments"])
                body = {"tool": "lookup_order", "call_id": call["id"], "arguments": args}
                async with self.http.post(f"{self.hook}/lookup", json=body) as r:
                    result = await r.text()
                tool_s += time.perf_counter() - t1
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        total = time.perf_counter() - t0
        return {"excl_tools_s": total - tool_s, "rounds": rounds, "prefill": prefill}


async def _run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from engine.runtime.model.demo import write_demo_model
    from gateway.app import create_app
    from gateway.http import make_runner
    from gateway.settings import Settings
    from tenants.migrate import upgrade_to_head

    model_dir = Path(args.model) if args.model else write_demo_model(tmp / "demo-model")
    hook_runner, hook = await _serve(_receiver(args.tool_ms / 1000))
    db = f"sqlite+aiosqlite:///{tmp}/tools.db"
    await upgrade_to_head(db)
    env = {
        "KVGATE_DATABASE_URL": db,
        "KVGATE_ADMIN_TOKEN": ADMIN,
        "KVGATE_DEVICE": "cpu",
        "KVGATE_KV_CACHE_BYTES": str(64 << 20),
        "KVGATE_MODEL": str(model_dir),
        "KVGATE_VAR_DIR": str(tmp / "var"),
        "KVGATE_LOG_LEVEL": "warning",
        "KVGATE_TOOL_ALLOWED_HOSTS": hook.removeprefix("http://"),
    }
    app = create_app(Settings.from_env(env), model_dir=str(model_dir))
    runner = make_runner(app, 10.0, 30.0, handler_cancellation=True, access_log=None)
    await runner.setup()
    await runner.listen_tcp("127.0.0.1", 0)
    host, port = runner.addresses[0][:2]
    try:
        async with aiohttp.ClientSession() as http:
            b = Bench(http, f"http://{host}:{port}", hook, args)
            b.model = (
                await (
                    await http.get(
                        f"{b.url}/v1/models",
                        headers={"Authorization": f"Bearer {await b.tenant('bench-warm', True)}"},
                    )
                ).json()
            )["data"][0]["id"]
            gw_key = await b.tenant("bench-gateway", True)
            cl_key = await b.tenant("bench-client", False)
            return await _measure(b, gw_key, cl_key, args)
    finally:
        await runner.cleanup()
        await hook_runner.cleanup()


async def _measure(b: Bench, gw_key: str, cl_key: str, args: Any) -> dict[str, Any]:
    repeats: list[dict[str, Any]] = []
    await b.gateway_turn(gw_key, "warm-up")
    await b.client_turn(cl_key, "warm-up")
    for rep in range(args.repeats):
        gw, cl = [], []
        for i in range(args.turns):
            ask = f"Where is order {i + 1}? (repeat {rep}, turn {i})"
            gw.append(await b.gateway_turn(gw_key, ask))
            cl.append(await b.client_turn(cl_key, ask))
        repeats.append({"gateway": gw, "client": cl})
    return _summary(repeats, args)


def _summary(repeats: list[dict[str, Any]], args: Any) -> dict[str, Any]:
    def per_repeat(mode: str, fn: Any) -> list[float]:
        return [statistics.median(fn(t) for t in r[mode]) for r in repeats]

    out: dict[str, Any] = {}
    for mode in ("gateway", "client"):
        out[mode] = {
            "turn_ms_excluding_tools": summarize(
                per_repeat(mode, lambda t: t["excl_tools_s"] * 1000)
            ),
            "per_round_ms_excluding_tools": summarize(
                per_repeat(mode, lambda t: t["excl_tools_s"] * 1000 / max(1, t["rounds"]))
            ),
            "prefill_tokens_per_continuation": summarize(
                per_repeat(mode, lambda t: statistics.mean(t["prefill"]) if t["prefill"] else 0)
            ),
            "rounds": statistics.median(t["rounds"] for r in repeats for t in r[mode]),
        }
    out["gateway"]["gateway_ms_per_round"] = summarize(
        per_repeat(
            "gateway", lambda t: statistics.median(t["gateway_ms"]) if t["gateway_ms"] else 0
        )
    )
    ratios = [
        statistics.median(t["excl_tools_s"] for t in r["client"])
        / statistics.median(t["excl_tools_s"] for t in r["gateway"])
        for r in repeats
    ]
    out["client_over_gateway_turn_time"] = summarize(ratios)
    return out


def main(argv: Sequence[str]) -> int:
    args = _parse(argv)
    config = {
        "benchmark": "tools",
        "model": args.model or "demo (Qwen2 geometry: hidden 256, 4 layers, vocab 2000), random",
        "device": "cpu",
        "turns": args.turns,
        "repeats": args.repeats,
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "tool_ms": args.tool_ms,
        "block_size": 16,
        "temperature": 0.0,
        "tool_choice": "named lookup_order (forced)",
        "client": "aiohttp on the server's event loop, loopback, keep-alive",
        "threads": os.environ.get("OMP_NUM_THREADS", "default"),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }
    print(json.dumps(config, indent=2))
    from gateway.settings import TelemetrySettings
    from gateway.telemetry import configure_logging

    configure_logging(TelemetrySettings("warning", True, "kvgate-bench", None))
    with tempfile.TemporaryDirectory() as tmp:
        results = asyncio.run(_run(args, Path(tmp)))
    rows = []
    for mode in ("gateway", "client"):
        r = results[mode]
        rows.append(
            [
                mode,
                r["rounds"],
                r["turn_ms_excluding_tools"]["median"],
                r["per_round_ms_excluding_tools"]["median"],
                r["prefill_tokens_per_continuation"]["median"],
            ]
        )
    print_table(
        ["loop", "rounds", "turn ms (no tools)", "per round ms", "prefill/continuation"], rows
    )
    g = results["gateway"]["gateway_ms_per_round"]
    print(f"gateway's own time per round: {g['median']:.3f} ms ({g['min']:.3f}-{g['max']:.3f})")
    ratio = results["client_over_gateway_turn_time"]
    print(
        f"client loop / gateway loop turn time: {ratio['median']:.2f}x "
        f"({ratio['min']:.2f}-{ratio['max']:.2f})"
    )
    write_json(args.out, {"config": config, "results": results})
    print(f"wrote {args.out}")
    return 0
