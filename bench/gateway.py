"""``kvgate bench gateway``: what the gateway and its limiter add on top of the engine.

Side by side in one run, interleaved request by request (so machine noise hits both alike):

    direct    AsyncEngine.generate(prompt ids, namespace=tenant salt, cache_scope=the scope the
              gateway gives the bench's server key)                        (no HTTP)
    gateway   POST /v1/chat/completions on loopback, on the HTTP layer ``kvgate serve`` runs
              (gateway/http; auth, prompt assembly, rate limit, engine, JSON), once with the
              Redis limiter and once with the in-process limiter
    workers   the same gateway (Redis limiter) with its engine in a worker process, as
              ``kvgate serve`` runs it (gateway/cluster/ -> engine/serving/worker/: the message
              transport over a Unix domain socket)
    workers_tcp  the same over loopback TCP (how a remote worker is reached)
    workers_in_process  workers over the Unix socket with the in-process limiter: what the
              zero-configuration ``kvgate serve`` (no KVGATE_REDIS_URL) runs

``worker_hop`` isolates the worker protocol: ``ClusterEngine.generate`` (no gateway) over the
Unix socket and over TCP against the in-process engine, interleaved, and the cost of encoding +
decoding one output frame.

The client (aiohttp's) runs on the server's event loop (the direct call has to), so its CPU is
charged to the gateway: its request building and response parsing add about 0.6 ms of their
own. ``*_written`` fields time the same requests until the gateway finished writing the response
(``_WriteClock``): what a remote client waits for, whatever its client library; ``*_stream``
fields a streamed answer read to its ``[DONE]``. A client on the server's loop also waits for the
handler's clean-up after the response (the limiter release, a Redis call whose send wakes
redis-server), which runs before the loop polls the client's socket again. The direct call
consumes every engine output as a streaming caller does; a non-streaming gateway answer asks the
engine for its first and final outputs only (``interim=False``), a streamed one for every output.

Same tenant, same prompt tokens, same pinned prefix, same greedy output length. The added
latency is the median of per-pair differences (gateway - direct) in each repeat; reported as
the median over repeats with the min-max spread. After each request the bench lets the event loop
finish what that request left behind (the gateway's limiter release, metrics and aiohttp
bookkeeping run after the response is sent) before timing the next one: a remote client never
waits for that work, and otherwise the next direct request would pay for it. Redis commands per
request are counted with MONITOR on a private redis-server (script-internal commands excluded):
the target is exactly one EVALSHA at admission (plus one at release, after the response).
``redis_limiter_alone`` times that admission without a gateway, back to back and after Redis
sat idle for about a request's time, as it does before each gateway request here: on a VM the
second pays for waking idle vCPUs, which is most of what the Redis rows add over the in-process
limiter's.
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
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

RESULTS = Path(__file__).resolve().parent / "results"
# request kinds timed against the direct call: (label, suffix of their result fields)
CLIENTS = (
    ("aiohttp", ""),
    ("aiohttp, until written", "_written"),
    ("aiohttp, stream", "_stream"),
    ("aiohttp, stream, until written", "_stream_written"),
)
SYSTEM = "You are the benchmark assistant of Example Corp. Answer in one short sentence. " * 3
ADMIN_TOKEN = "bench-admin-token-0123456789"
IDLE_S = 0.01  # Redis idle before an admission of `_limiter_rtt`'s second kind


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvgate bench gateway", description=__doc__)
    p.add_argument("--requests", type=int, default=60, help="request pairs per repeat")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--model", help="model directory (default: the demo model, written to tmp)")
    p.add_argument("--redis-server", default="redis-server", help="binary for a private Redis")
    p.add_argument("--out", type=Path, default=RESULTS / "gateway.json")
    p.add_argument(
        "--only",
        choices=("ttft", "stages"),
        help="ttft: time to the first content chunk through `kvgate serve` vs the engine's own"
        " (bench/gateway_ttft.py; its own options: --only ttft --help); stages: where that"
        " time goes, step by step (bench/gateway_ttft_stages.py)",
    )
    return p.parse_args(list(argv))


class _Setup:
    """A gateway app on loopback + the engine it wraps + one tenant with a pinned prompt."""

    def __init__(self, app: web.Application, runner: Any, url: str) -> None:
        self.app, self.runner, self.url = app, runner, url
        self.key = ""
        self.salt = ""
        self.scope: Any = None  # the gateway's cache scope of this key's requests
        self.prompt_ids: list[int] = []


async def _start(settings: Any, engine: Any = None, cluster: Any = None) -> _Setup:
    from gateway.app import create_app
    from gateway.http import make_runner

    app = create_app(settings, engine=engine, cluster=cluster)
    # the HTTP layer `kvgate serve` runs (gateway/http), with its default read deadlines
    runner = make_runner(app, 10.0, 30.0, handler_cancellation=True, access_log=None)
    await runner.setup()
    await runner.listen_tcp("127.0.0.1", 0)
    host, port = runner.addresses[0][:2]
    return _Setup(app, runner, f"http://{host}:{port}")


async def _make_tenant(setup: _Setup, http: aiohttp.ClientSession, tenant_id: str) -> None:
    from gateway.chat.cache_scope import derive
    from gateway.chat.prompt import assemble
    from gateway.chat.schemas import ChatMessage
    from gateway.context import STATE

    hdrs = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    limits = {"rpm": 10_000_000, "tpm": 1_000_000_000, "max_concurrency": 1000}
    body = {"id": tenant_id, "name": tenant_id, "system_prompt": SYSTEM, "limits": limits}
    async with http.post(f"{setup.url}/admin/v1/tenants", json=body, headers=hdrs) as r:
        assert r.status == 201, await r.text()
    url = f"{setup.url}/admin/v1/tenants/{tenant_id}/keys"
    async with http.post(url, json={"kind": "server"}, headers=hdrs) as r:
        created = await r.json()
        setup.key = created["key"]
    state = setup.app[STATE]
    rt = await state.store.get_tenant_runtime(tenant_id)
    entry = await state.pins.activate(rt)
    setup.salt = rt.cache_salt
    # a server key without `user`: the key's scope (gateway/chat/cache_scope.py)
    setup.scope = derive(rt.cache_salt, f"key:{created['id']}", len(entry.prefix.ids))
    setup.prompt_ids = assemble(
        state.tokenizer, entry.prefix, [ChatMessage(role="user", content="hi")]
    )


class _WriteClock:
    """``perf_counter()`` when the gateway last finished writing a response to its socket: when
    a remote client has the bytes. The bench's own client, on the server's event loop, reads
    them only after the handler's clean-up (limiter release: a Redis call) has yielded, since
    the loop polls sockets between steps; a remote client never waits for that."""

    last = 0.0

    @classmethod
    def install(cls) -> Callable[[], None]:
        """Wrap ``StreamResponse.write_eof`` (web.Response's calls it); returns the undo."""
        original = web.StreamResponse.write_eof

        async def write_eof(resp: web.StreamResponse, data: bytes = b"") -> None:
            await original(resp, data)
            cls.last = time.perf_counter()

        web.StreamResponse.write_eof = write_eof  # type: ignore[method-assign]
        return lambda: setattr(web.StreamResponse, "write_eof", original)


async def _timed(request: Callable[[], Awaitable[None]]) -> float:
    """Seconds ``request()`` takes; then the event loop settles (see ``_settle``)."""
    return (await _timed_written(request))[0]


async def _timed_written(request: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    """Seconds until ``request()`` returned and until its response was written (see
    ``_WriteClock``); then the event loop settles (see ``_settle``)."""
    tasks = len(asyncio.all_tasks())
    t0 = time.perf_counter()
    await request()
    elapsed = time.perf_counter() - t0
    written = _WriteClock.last - t0
    await _settle(tasks)
    return elapsed, written


async def _direct(engine: Any, setup: _Setup, params: Any) -> float:
    from engine.api import GenerateOptions

    async def request() -> None:
        options = GenerateOptions(setup.salt, cache_scope=setup.scope)
        stream = engine.generate(setup.prompt_ids, params, options)
        async for _ in stream:
            pass

    return await _timed(request)


async def _via_gateway(
    http: aiohttp.ClientSession, setup: _Setup, body: dict[str, Any]
) -> tuple[float, float]:
    """Seconds until the client had the answer, and until the gateway had written it."""

    async def request() -> None:
        hdrs = {"Authorization": f"Bearer {setup.key}"}
        async with http.post(f"{setup.url}/v1/chat/completions", json=body, headers=hdrs) as r:
            data = await r.read()
        assert r.status == 200, data
        if body.get("stream"):
            assert data.endswith(b"data: [DONE]\n\n"), data

    return await _timed_written(request)


async def _settle(tasks: int, limit_s: float = 0.5) -> None:
    """Run the event loop until the tasks a request started (the server's handler, its
    shielded clean-up) are done, then once more; ``tasks``: the count before the request."""
    deadline = time.monotonic() + limit_s
    while len(asyncio.all_tasks()) > tasks and time.monotonic() < deadline:
        await asyncio.sleep(0)
    await asyncio.sleep(0)


# timed lists per repeat: directs (d*), gateway answers (aio; sse: streamed; *_w: until
# written); PAIRED: (direct, gateway, result field suffix)
KINDS = ("d1", "aio", "aio_w", "d2", "sse", "sse_w")
PAIRED = (
    ("d1", "aio_w", "_written"),
    ("d2", "sse", "_stream"),
    ("d2", "sse_w", "_stream_written"),
)


def _add(t: dict[str, list[float]], kind: str, timed: tuple[float, float]) -> None:
    t[kind].append(timed[0])
    t[f"{kind}_w"].append(timed[1])


def _summary(direct: list[float], gateway: list[float], suffix: str = "") -> dict[str, float]:
    diffs = [g - d for g, d in zip(gateway, direct, strict=True)]
    out = {} if suffix else {"direct_p50_ms": statistics.median(direct) * 1e3}
    return out | {
        f"gateway_p50_ms{suffix}": statistics.median(gateway) * 1e3,
        f"added_p50_ms{suffix}": statistics.median(diffs) * 1e3,
        f"added_p90_ms{suffix}": statistics.quantiles(diffs, n=10)[-1] * 1e3,
    }


async def _measure(
    engine: Any, setups: dict[str, _Setup], args: argparse.Namespace, model: str
) -> dict[str, Any]:
    from engine import SamplingParams

    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    body |= {"max_tokens": args.max_tokens, "temperature": 0}
    stream_body = body | {"stream": True}
    per_repeat: dict[str, list[dict[str, float]]] = {name: [] for name in setups}
    async with aiohttp.ClientSession() as http:
        for setup in setups.values():  # warm-up: connections, script, caches
            for _ in range(5):
                await _via_gateway(http, setup, body)
                await _via_gateway(http, setup, stream_body)
                await _direct(engine, setup, params)
        for _ in range(args.repeats):
            for name, setup in setups.items():
                # pairs (direct, gateway): each gateway request follows a direct one
                t: dict[str, list[float]] = {k: [] for k in KINDS}
                for _ in range(args.requests):
                    t["d1"].append(await _direct(engine, setup, params))
                    _add(t, "aio", await _via_gateway(http, setup, body))
                    t["d2"].append(await _direct(engine, setup, params))
                    _add(t, "sse", await _via_gateway(http, setup, stream_body))
                pairs = _summary(t["d1"], t["aio"])
                for direct, kind, suffix in PAIRED:
                    pairs |= _summary(t[direct], t[kind], suffix)
                per_repeat[name].append(pairs)
    out: dict[str, Any] = {}
    for name, reps in per_repeat.items():
        out[name] = _spread(reps)
        out[name]["repeats"] = reps
    return out


async def _count_redis_commands(redis_url: str, setup: _Setup, model: str, n: int) -> dict:
    """MONITOR while ``n`` gateway requests run: client commands by name and first argument."""
    import redis.asyncio as aioredis

    mon_client = aioredis.Redis.from_url(redis_url)
    marker = aioredis.Redis.from_url(redis_url)
    await marker.ping()
    counts: dict[str, int] = {}
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with aiohttp.ClientSession() as http, mon_client.monitor() as mon:
        for _ in range(n):
            await _via_gateway(http, setup, body)
        await marker.echo("bench-monitor-end")
        while True:
            cmd = await mon.next_command()
            if "bench-monitor-end" in cmd["command"]:
                break
            if cmd.get("client_type") == "lua":
                continue
            words = cmd["command"].split()
            name = words[0].upper()
            if name in ("EVALSHA", "EVAL") and len(words) > 6:
                name += f" {words[6]}"  # the script's mode: acquire | release
            counts[name] = counts.get(name, 0) + 1
    await mon_client.aclose()
    await marker.aclose()
    return {"requests": n, "commands": counts}


async def _limiter_rtt(redis_url: str, n: int = 200) -> dict[str, float]:
    """Bare admission latency of the Redis limiter (one EVALSHA), for context: back to back,
    and after ``IDLE_S`` with Redis idle, as in the gateway rows (each gateway request follows a
    direct one: Redis has had nothing to do for about a request's time). On a VM the second
    includes waking the idle vCPUs of both processes."""
    from gateway.ratelimit import Limits, RedisLimiter
    from gateway.ratelimit.types import Lease

    lim = RedisLimiter.connect(redis_url, 2.0, "kvgate-bench:")
    await lim.warm()
    limits = Limits(rpm=10_000_000, tpm=1_000_000_000, max_concurrency=1000)
    times: dict[str, list[float]] = {"": [], "_after_idle": []}
    for _ in range(n):
        for kind, times_of in times.items():
            if kind:
                await asyncio.sleep(IDLE_S)
            t0 = time.perf_counter()
            d = await lim.acquire(Lease.single("rtt", limits, 100))
            times_of.append(time.perf_counter() - t0)
            assert d.lease is not None
            await lim.release(d.lease, 50)
    await lim.close()
    out: dict[str, float] = {"idle_s": IDLE_S}
    for kind, ts in times.items():
        out[f"acquire_p50_ms{kind}"] = statistics.median(ts) * 1e3
        out[f"acquire_p90_ms{kind}"] = statistics.quantiles(ts, n=10)[-1] * 1e3
    return out


async def _run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from engine import AsyncEngine
    from engine.runtime.model.demo import write_demo_model
    from gateway.settings import Settings
    from tenants.migrate import upgrade_to_head

    model_dir = Path(args.model) if args.model else write_demo_model(tmp / "demo-model")
    redis = _PrivateRedis(args.redis_server, tmp)
    setups: dict[str, _Setup] = {}
    engine = AsyncEngine.from_pretrained(model_dir, device="cpu", kv_cache_bytes=64 << 20)
    try:
        runs = (
            ("redis", {"KVGATE_REDIS_URL": redis.url}),
            ("in_process", {}),
            ("workers", {"KVGATE_REDIS_URL": redis.url}),
            ("workers_tcp", {"KVGATE_REDIS_URL": redis.url}),
            ("workers_in_process", {}),
        )
        for name, extra in runs:
            db = f"sqlite+aiosqlite:///{tmp}/{name}.db"
            await upgrade_to_head(db)
            env = {
                "KVGATE_DATABASE_URL": db,
                "KVGATE_ADMIN_TOKEN": ADMIN_TOKEN,
                "KVGATE_KEY_CACHE_TTL_S": "600",
                "KVGATE_MODEL_NAME": model_dir.resolve().name,
                "KVGATE_USAGE_SPOOL_DIR": str(tmp / f"spool-{name}"),  # one spool per gateway
                "KVGATE_VAR_DIR": str(tmp / "var"),  # its secrets.key, never the checkout's var/
                **extra,
            }
            # One engine for all: the app that starts it first owns it; the others reuse it.
            settings = Settings.from_env(env)
            if name.startswith("workers"):
                cluster = await _worker_engine(model_dir, settings, unix=name != "workers_tcp")
                setups[name] = await _start(settings, cluster=cluster)
            else:
                setups[name] = await _start(settings, engine)
            async with aiohttp.ClientSession() as http:
                await _make_tenant(setups[name], http, f"bench-{name.replace('_', '-')}")
        model = model_dir.resolve().name
        undo = _WriteClock.install()
        try:
            results = await _measure(engine, setups, args, model)
        finally:
            undo()
        results["redis_round_trips"] = await _count_redis_commands(
            redis.url, setups["redis"], model, 20
        )
        results["redis_limiter_alone"] = await _limiter_rtt(redis.url)
        results["worker_hop"] = await _worker_hop(engine, setups, args)
        return results
    finally:
        for setup in reversed(list(setups.values())):
            await setup.runner.cleanup()
        redis.stop()


async def _worker_engine(model_dir: Path, settings: Any, *, unix: bool) -> Any:
    """A ClusterEngine over one local worker process (the ``kvgate serve`` default: ``unix``)."""
    from gateway.cluster.bootstrap import open_cluster

    # the worker reads its engine settings from the environment, as `kvgate worker` does
    os.environ.update(KVGATE_DEVICE="cpu", KVGATE_KV_CACHE_BYTES=str(64 << 20))
    return await open_cluster(settings, str(model_dir), local_unix=unix)


async def _worker_hop(
    engine: Any, setups: dict[str, _Setup], args: argparse.Namespace
) -> dict[str, Any]:
    """ClusterEngine.generate (Unix socket, TCP) vs AsyncEngine.generate, interleaved, in
    ``args.repeats`` repeats (median, min-max over repeats); and the frame codec."""
    from engine import SamplingParams
    from gateway.context import STATE

    setup = setups["workers"]  # its tenant salt and prompt: the same for all of them
    names = {"unix": "workers", "tcp": "workers_tcp"}
    clusters = {hop: setups[name].app[STATE].engine for hop, name in names.items()}
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    for c in clusters.values():  # warm-up: pooled connections
        for _ in range(5):
            await _direct(c, setup, params)
    reps: dict[str, list[dict[str, float]]] = {name: [] for name in clusters}
    for _ in range(args.repeats):
        diffs: dict[str, list[float]] = {name: [] for name in clusters}
        hops: dict[str, list[float]] = {name: [] for name in clusters}
        for _ in range(args.requests):
            for name, cluster in clusters.items():
                d = await _direct(engine, setup, params)
                c = await _direct(cluster, setup, params)
                diffs[name].append(c - d)
                hops[name].append(c)
        for name in clusters:
            reps[name].append(
                {
                    "cluster_generate_p50_ms": statistics.median(hops[name]) * 1e3,
                    "added_p50_ms": statistics.median(diffs[name]) * 1e3,
                    "added_p90_ms": statistics.quantiles(diffs[name], n=10)[-1] * 1e3,
                }
            )
    out: dict[str, Any] = {"frame_codec_us": _frame_codec_us()}
    for name, rs in reps.items():
        out[name] = _spread(rs)
    out["added_p50_ms"] = out["unix"]["added_p50_ms"]["median"]  # the kvgate serve default
    return out


def _spread(reps: list[dict[str, float]]) -> dict[str, Any]:
    """Median, min and max over the repeats of each measured key."""
    return {
        key: {
            "median": statistics.median(r[key] for r in reps),
            "min": min(r[key] for r in reps),
            "max": max(r[key] for r in reps),
        }
        for key in reps[0]
    }


def _frame_codec_us(n: int = 20000) -> float:
    """Encode + decode of one decode-step output frame (one token, timings absent), in µs:
    the worker protocol's codec (engine/remote/messages.py)."""
    from engine.outputs import RequestMetrics, RequestOutput
    from engine.remote import messages as m
    from engine.serving.worker.transport import output_frame

    out = RequestOutput("r", 30, (1, 2, 3), (3,), 16, False, None, RequestMetrics(0.0))
    t0 = time.perf_counter()
    for _ in range(n):
        m.decode_reply(m.encode(output_frame(1, out, first=False)))
    return (time.perf_counter() - t0) / n * 1e6


class _PrivateRedis:
    """redis-server on a free loopback port, no persistence: MONITOR sees only this bench."""

    def __init__(self, binary: str, workdir: Path) -> None:
        import socket
        import subprocess

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        cmd = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        cmd += ["--appendonly", "no", "--dir", str(workdir)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


def _table(results: dict[str, Any]) -> str:
    rows = [
        "| limiter | client | direct p50 ms | gateway p50 ms | added p50 ms (min-max) |"
        " added p90 ms |"
    ]
    rows.append("| --- | --- | --- | --- | --- | --- |")
    for name in ("redis", "in_process", "workers", "workers_tcp", "workers_in_process"):
        r = results[name]
        for client, sfx in CLIENTS:
            added = r[f"added_p50_ms{sfx}"]
            rows.append(
                f"| {name} | {client} | {r['direct_p50_ms']['median']:.2f}"
                f" | {r[f'gateway_p50_ms{sfx}']['median']:.2f}"
                f" | {added['median']:.2f} ({added['min']:.2f}-{added['max']:.2f})"
                f" | {r[f'added_p90_ms{sfx}']['median']:.2f} |"
            )
    return "\n".join(rows)


def main(argv: Sequence[str]) -> int:
    if "stages" in argv and "--only" in argv:  # where the time to first content goes
        from bench import gateway_ttft_stages

        return gateway_ttft_stages.main(argv)
    if "--only" in argv:  # one part: TTFT through `kvgate serve` vs the engine's own
        from bench import gateway_ttft

        return gateway_ttft.main(argv)
    args = _parse(argv)
    config = {
        "benchmark": "gateway",
        "model": args.model or "demo (Qwen2 geometry: hidden 256, 4 layers, vocab 2000)",
        "device": "cpu",
        "requests_per_repeat": args.requests,
        "repeats": args.repeats,
        "max_tokens": args.max_tokens,
        "client": "aiohttp's, on loopback, same event loop as the server, keep-alive (added_*;"
        " until the gateway wrote the answer: added_*_written; streamed: added_*_stream)",
        "between requests": "event loop settled (post-response work timed by neither side)",
        "logging": "level warning (no per-request log line)",
        "threads": os.environ.get("OMP_NUM_THREADS", "default"),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }
    print(json.dumps(config, indent=2))
    from gateway.settings import TelemetrySettings
    from gateway.telemetry import configure_logging

    # Request log lines off (level warning): the bench measures the request path, not stdout.
    configure_logging(TelemetrySettings("warning", True, "kvgate-bench", None))
    with tempfile.TemporaryDirectory() as tmp:
        results = asyncio.run(_run(args, Path(tmp)))
    trips = results["redis_round_trips"]
    per_request = {k: v / trips["requests"] for k, v in trips["commands"].items()}
    results["redis_round_trips"]["per_request"] = per_request
    print(_table(results))
    print(f"Redis commands per request (MONITOR, client side): {per_request}")
    hop = results["worker_hop"]
    for name in ("unix", "tcp"):
        a, a90 = hop[name]["added_p50_ms"], hop[name]["added_p90_ms"]["median"]
        print(
            f"Worker hop over {name} (ClusterEngine vs AsyncEngine): +{a['median']:.2f} ms p50"
            f" ({a['min']:.2f}-{a['max']:.2f}), +{a90:.2f} ms p90"
        )
    print(f"frame codec {hop['frame_codec_us']:.1f} us")
    rtt = results["redis_limiter_alone"]
    print(
        f"Redis limiter alone: acquire p50 {rtt['acquire_p50_ms']:.3f} ms back to back, "
        f"{rtt['acquire_p50_ms_after_idle']:.3f} ms after {rtt['idle_s'] * 1e3:.0f} ms idle "
        f"(p90 {rtt['acquire_p90_ms']:.3f} / {rtt['acquire_p90_ms_after_idle']:.3f} ms)"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": config, "results": results}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0
