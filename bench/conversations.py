"""``kvgate bench conversations``: ten-turn conversations kept by the gateway
(``previous_response_id``) vs the client resending the whole history (chat completions).

Side by side in one run, on one gateway on loopback (the default model unless ``--model``),
each conversation's turns interleaved with its twin's (machine noise hits both alike):

    responses   POST /v1/responses, stream, ``previous_response_id`` of the last turn: the
                gateway continues from the stored tail (gateway/responses/tail.py)
    chat        POST /v1/chat/completions, stream, every earlier turn resent as messages (the
                assistant's answers as text)

Every conversation has its own ``user`` (its own cache scope: conversations never share blocks
past the tenant prefix, even when they ask the same questions).

Per turn (medians over conversations, min-max spread): time to first token (first text event),
prefill tokens (``input - cached``: what the turn computed), cached tokens. Three phases:

    c1      1 conversation, ``--turns`` turns
    c16     16 concurrent conversations, ``--turns-16`` turns (fewer: 2 cores serve them all)
    cycle   1 conversation; after every turn another tenant's traffic (kept longer: "24h")
            pushes more blocks through the device pool than it holds, so the conversation's
            blocks leave the device (offloaded to the host tier) and the next turn restores them;
            host-tier restores per turn are reported

Greedy decoding, ``--max-tokens`` output tokens per turn (OpenAI's minimum of
``max_output_tokens`` is 16).
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import cpu_model, print_table, summarize, write_json

RESULTS = Path(__file__).resolve().parent / "results"
ADMIN = "bench-admin-token-0123456789"
SYSTEM = (
    "You are the concierge of the Grand Hotel. Guests ask about rooms, breakfast, the spa, "
    "taxis and the city. Answer in one short sentence. "
) * 3
QUESTIONS = [
    "Hello, what time is breakfast?",
    "Is there a pool?",
    "Can I book a taxi for noon?",
    "What is the wifi password?",
    "Where can I have dinner nearby?",
    "Is the spa open on Sunday?",
    "Can I check out late?",
    "Do you have a gym?",
    "How far is the station?",
    "Thank you, goodbye!",
]


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvgate bench conversations", description=__doc__)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--turns-16", type=int, default=5, dest="turns_16")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--model", help="model path (default: the default model, else the demo one)")
    p.add_argument("--kv-bytes", type=int, default=1 << 30, help="device KV of c1 / c16")
    p.add_argument("--cycle-kv-bytes", type=int, default=64 << 20, help="device KV of cycle")
    p.add_argument("--host-kv-bytes", type=int, default=2 << 30, help="host tier of cycle")
    p.add_argument("--only", choices=("c1", "c16", "cycle"), action="append")
    p.add_argument("--out", type=Path, default=RESULTS / "conversations.json")
    return p.parse_args(list(argv))


@dataclass
class Turn:
    ttft_ms: float
    input_tokens: int
    cached_tokens: int

    @property
    def prefill(self) -> int:
        return self.input_tokens - self.cached_tokens


@dataclass
class Conversation:
    key: str
    user: str
    previous: str | None = None
    messages: list[dict[str, str]] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)


async def _events(resp: aiohttp.ClientResponse) -> Any:
    """Each SSE ``data:`` payload as JSON, with the time it arrived."""
    async for raw in resp.content:
        line = raw.decode().strip()
        if line.startswith("data: ") and line != "data: [DONE]":
            yield time.perf_counter(), json.loads(line[6:])


class Client:
    def __init__(self, http: aiohttp.ClientSession, url: str, model: str, max_tokens: int) -> None:
        self.http, self.url, self.model, self.max_tokens = http, url, model, max_tokens

    async def responses_turn(self, c: Conversation, text: str) -> Turn:
        body: dict[str, Any] = {
            "model": self.model,
            "input": text,
            "stream": True,
            "temperature": 0.0,
            "max_output_tokens": self.max_tokens,
            "previous_response_id": c.previous,
            "user": c.user,  # its own cache scope, as the chat twin's
        }
        t0, first, final = time.perf_counter(), None, None
        async with self.http.post(
            f"{self.url}/v1/responses", json=body, headers={"Authorization": f"Bearer {c.key}"}
        ) as r:
            assert r.status == 200, await r.text()
            async for at, event in _events(r):
                if event["type"] == "response.output_text.delta" and first is None:
                    first = at
                if event["type"] in ("response.completed", "response.incomplete"):
                    final = event["response"]
        assert final is not None
        c.previous = final["id"]
        usage = final["usage"]
        cached = usage["input_tokens_details"]["cached_tokens"]
        return Turn(((first or time.perf_counter()) - t0) * 1000, usage["input_tokens"], cached)

    async def chat_turn(self, c: Conversation, text: str) -> Turn:
        c.messages.append({"role": "user", "content": text})
        body = {
            "model": self.model,
            "messages": c.messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0.0,
            "max_tokens": self.max_tokens,
            "user": c.user,
        }
        t0, first, usage, parts = time.perf_counter(), None, None, []
        async with self.http.post(
            f"{self.url}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {c.key}"},
        ) as r:
            assert r.status == 200, await r.text()
            async for at, chunk in _events(r):
                for choice in chunk.get("choices", []):
                    piece = choice["delta"].get("content")
                    if piece:
                        first = first or at
                        parts.append(piece)
                usage = chunk.get("usage") or usage
        assert usage is not None
        c.messages.append({"role": "assistant", "content": "".join(parts)})
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        return Turn(((first or time.perf_counter()) - t0) * 1000, usage["prompt_tokens"], cached)


async def _admin(http: aiohttp.ClientSession, url: str, method: str, path: str, body: Any) -> Any:
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with http.request(method, f"{url}/admin/v1{path}", json=body, headers=headers) as r:
        assert r.status < 300, await r.text()
        return await r.json()


async def _tenant(http: aiohttp.ClientSession, url: str, tid: str, prompt: str | None) -> str:
    limits = {"rpm": 10**7, "tpm": 10**9, "max_concurrency": 200, "max_output_tokens": 400}
    body: dict[str, Any] = {"id": tid, "name": tid, "limits": limits}
    if prompt:
        body["system_prompt"] = prompt
    await _admin(http, url, "POST", "/tenants", body)
    key = await _admin(http, url, "POST", f"/tenants/{tid}/keys", {"kind": "server"})
    for _ in range(1000):
        info = await _admin(http, url, "GET", f"/tenants/{tid}/cache", None)
        if info["pin_state"] in ("pinned", "no_prompt", "rejected"):
            break
        await asyncio.sleep(0.02)
    return str(key["key"])


async def _conversations(
    client: Client, keys: tuple[str, str], n: int, turns: int, between: Any = None
) -> dict[str, list[list[Turn]]]:
    """``n`` pairs of twin conversations, each pair's turns interleaved (responses first on
    even turns, chat first on odd ones)."""
    pairs = [(Conversation(keys[0], f"r{i}"), Conversation(keys[1], f"c{i}")) for i in range(n)]

    async def run(pair: tuple[Conversation, Conversation]) -> None:
        r, c = pair
        for k in range(turns):
            text = QUESTIONS[k % len(QUESTIONS)]
            order = [(client.responses_turn, r), (client.chat_turn, c)]
            for fn, conv in order if k % 2 == 0 else order[::-1]:
                conv.turns.append(await fn(conv, text))
            if between is not None:
                await between()

    await asyncio.gather(*(run(p) for p in pairs))
    return {"responses": [p[0].turns for p in pairs], "chat": [p[1].turns for p in pairs]}


def _per_turn(runs: dict[str, list[list[Turn]]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for mode, convs in runs.items():
        rows = []
        for k in range(len(convs[0])):
            turns = [c[k] for c in convs]
            rows.append(
                {
                    "turn": k + 1,
                    "ttft_ms": summarize([t.ttft_ms for t in turns]),
                    "prefill_tokens": summarize([float(t.prefill) for t in turns]),
                    "cached_tokens": summarize([float(t.cached_tokens) for t in turns]),
                    "input_tokens": summarize([float(t.input_tokens) for t in turns]),
                }
            )
        out[mode] = rows
    return out


async def _gateway(
    tmp: Path, name: str, model: Path, kv_bytes: int, host_bytes: int
) -> tuple[Any, str, Any]:
    from gateway.app import create_app
    from gateway.http import make_runner
    from gateway.settings import Settings
    from tenants.migrate import upgrade_to_head

    db = f"sqlite+aiosqlite:///{tmp}/{name}.db"
    await upgrade_to_head(db)
    env = {
        "KVGATE_DATABASE_URL": db,
        "KVGATE_ADMIN_TOKEN": ADMIN,
        "KVGATE_DEVICE": "cpu",
        "KVGATE_KV_CACHE_BYTES": str(kv_bytes),
        "KVGATE_HOST_KV_BYTES": str(host_bytes),
        "KVGATE_MODEL": str(model),
        "KVGATE_VAR_DIR": str(tmp / f"var-{name}"),
        "KVGATE_LOG_LEVEL": "warning",
        "KVGATE_USAGE_LEDGER": "false",
    }
    app = create_app(Settings.from_env(env), model_dir=str(model))
    runner = make_runner(app, 10.0, 30.0, handler_cancellation=True, access_log=None)
    await runner.setup()
    await runner.listen_tcp("127.0.0.1", 0)
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}", app


async def _phase(args: argparse.Namespace, tmp: Path, model: Path, phase: str) -> dict[str, Any]:
    from gateway.context import STATE

    cycle = phase == "cycle"
    kv = args.cycle_kv_bytes if cycle else args.kv_bytes
    runner, url, app = await _gateway(tmp, phase, model, kv, args.host_kv_bytes if cycle else 0)
    try:
        async with aiohttp.ClientSession() as http:
            keys = (
                await _tenant(http, url, "bench-responses", SYSTEM),
                await _tenant(http, url, "bench-chat", SYSTEM),
            )
            model_id = (
                await (
                    await http.get(
                        f"{url}/v1/models", headers={"Authorization": f"Bearer {keys[0]}"}
                    )
                ).json()
            )["data"][0]["id"]
            client = Client(http, url, model_id, args.max_tokens)
            engine = app[STATE].engine
            await _conversations(client, keys, 1, 1)  # warm-up: compile, first pins
            n, turns = (16, args.turns_16) if phase == "c16" else (1, args.turns)
            flood = await _flooder(http, url, client, engine) if cycle else None
            before = engine.cache_stats()
            t0 = time.perf_counter()
            runs = await _conversations(client, keys, n, turns, flood)
            after = engine.cache_stats()
            return {
                "conversations": n,
                "turns": turns,
                "seconds": time.perf_counter() - t0,
                "device_blocks": after.blocks_total,
                "host_blocks": after.host_blocks_total,
                "blocks_offloaded": after.blocks_offloaded - before.blocks_offloaded,
                "blocks_restored": after.blocks_restored - before.blocks_restored,
                "host_hit_tokens": after.host_hit_tokens - before.host_hit_tokens,
                "per_turn": _per_turn(runs),
            }
    finally:
        await runner.cleanup()


async def _flooder(http: aiohttp.ClientSession, url: str, client: Client, engine: Any) -> Any:
    """After each turn: another tenant's distinct prompts, kept longer than the conversations'
    blocks, until more blocks than the device holds went through it."""
    key = await _tenant(http, url, "bench-flood", None)
    flood = Conversation(key, "flood")
    total = engine.cache_stats().blocks_total
    count = [0]

    async def between() -> None:
        for _ in range(total // 4 + 1):  # a few blocks each
            count[0] += 1
            text = " ".join(f"f{count[0]}w{j}" for j in range(12))
            body = {
                "model": client.model,
                "input": text,
                "max_output_tokens": 16,
                "store": False,
                "prompt_cache_retention": "24h",
            }
            async with http.post(
                f"{url}/v1/responses", json=body, headers={"Authorization": f"Bearer {flood.key}"}
            ) as r:
                assert r.status == 200, await r.text()

    return between


def _model(args: argparse.Namespace, tmp: Path) -> tuple[Path, str]:
    if args.model:
        return Path(args.model), args.model
    from gateway.commands.default_model import DefaultModelUnavailable, ensure_default_model

    try:
        path = ensure_default_model(Path.home() / ".cache" / "kvgate" / "models", log=print)
    except DefaultModelUnavailable as exc:
        from engine.runtime.model.demo import write_demo_model

        print(f"the default model is not available ({exc}): the demo model instead")
        return write_demo_model(tmp / "demo"), "demo (random weights)"
    return path, "SmolLM2-135M-Instruct Q4_1 GGUF (the default model)"


def _print(results: dict[str, Any]) -> None:
    for phase, r in results.items():
        print(f"\n{phase}: {r['conversations']} conversation(s), {r['turns']} turns")
        rows = []
        for a, b in zip(r["per_turn"]["responses"], r["per_turn"]["chat"], strict=True):
            rows.append(
                [
                    a["turn"],
                    a["ttft_ms"]["median"],
                    b["ttft_ms"]["median"],
                    a["prefill_tokens"]["median"],
                    b["prefill_tokens"]["median"],
                    a["cached_tokens"]["median"],
                    b["cached_tokens"]["median"],
                ]
            )
        headers = ["turn", "ttft resp", "ttft chat", "prefill resp", "prefill chat"]
        print_table([*headers, "cached resp", "cached chat"], rows)
        if phase == "cycle":
            print(
                f"offloaded {r['blocks_offloaded']} blocks, restored {r['blocks_restored']}, "
                f"host-tier hit tokens {r['host_hit_tokens']}"
            )


def main(argv: Sequence[str]) -> int:
    args = _parse(argv)
    from gateway.settings import TelemetrySettings
    from gateway.telemetry import configure_logging

    configure_logging(TelemetrySettings("warning", True, "kvgate-bench", None))
    phases = args.only or ["c1", "c16", "cycle"]
    with tempfile.TemporaryDirectory() as tmp:
        model, model_name = _model(args, Path(tmp))
        config = {
            "benchmark": "conversations",
            "model": model_name,
            "device": "cpu",
            "cpu": cpu_model(),
            "threads": os.environ.get("OMP_NUM_THREADS", "default"),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "turns": args.turns,
            "turns_16": args.turns_16,
            "turns_16_note": "16 concurrent conversations run fewer turns (2 cores serve them)",
            "max_output_tokens": args.max_tokens,
            "temperature": 0.0,
            "kv_bytes": args.kv_bytes,
            "cycle_kv_bytes": args.cycle_kv_bytes,
            "host_kv_bytes": args.host_kv_bytes,
            "block_size": 16,
            "system_prompt_chars": len(SYSTEM),
        }
        print(json.dumps(config, indent=2))
        results: dict[str, Any] = {}
        for phase in phases:  # each phase written as it ends (a later one may fail)
            results[phase] = asyncio.run(_phase(args, Path(tmp), model, phase))
            write_json(args.out, {"config": config, **results})
    _print(results)
    medians = {
        phase: {
            mode: statistics.median(t["prefill_tokens"]["median"] for t in r["per_turn"][mode][1:])
            for mode in ("responses", "chat")
        }
        for phase, r in results.items()
        if len(r["per_turn"]["responses"]) > 1
    }
    write_json(args.out, {"config": config, "median_prefill_after_turn_1": medians, **results})
    print(f"wrote {args.out}")
    return 0
