"""``kvgate bench gateway --only ttft``: time to the first content chunk through ``kvgate serve``
against the engine's own time to first token, same prompt, side by side in one run.

    gateway   ``kvgate serve`` as a user runs it (a subprocess: the gateway, its local worker over
              the Unix socket, the in-process limiter unless ``--redis-url``), a tenant with a
              pinned system prompt of at least ``--tenant-prompt`` tokens, a server key; a
              streamed ``POST /v1/chat/completions`` of a new user turn (19 tokens with the
              default model) on a keep-alive raw socket: from the request's last byte sent to
              the first SSE event with content received (the role chunk's time is kept too)
    engine    ``Engine.generate`` of the same token ids (the gateway's own prompt assembly),
              ``max_tokens=1``, the system prompt pinned: ``kvgate bench model``'s TTFT, in
              this process, on the worker's thread count

Each pair is one new turn (turn ``i`` sent to both: each has its own cache, so both see it for
the first time), the two sides alternating which goes first. ``added`` is the median (p90) of
the per-pair differences in each repeat; repeats give the spread. The target (W4.5 item 3):
gateway p50 <= engine p50 + 3 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The engine's process variables (OMP_WAIT_POLICY=PASSIVE, the ISA caps) before torch loads, as in
# the worker: bench.model imports torch, and torch's OpenMP threads spinning beside the engine's
# kernel pool would slow this side's steps and flatter the gateway.
import engine.runtime  # noqa: F401  (first: see above)
from bench.common import cpu_model
from bench.model import POLICY

RESULTS = Path(__file__).resolve().parent / "results"
ADMIN_TOKEN = "bench-admin-token-0123456789"
MODEL_NAME = "bench-model"
TARGET_MS = 3.0


def parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvgate bench gateway --only ttft", description=__doc__)
    p.add_argument("--only", choices=("ttft",), default="ttft")
    p.add_argument("--model", type=Path, help="HF dir or .gguf (default: the default model)")
    p.add_argument("--requests", type=int, default=30, help="pairs per repeat")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=2, help="tokens per gateway answer")
    p.add_argument("--tenant-prompt", type=int, default=760, help="system prompt tokens (min)")
    p.add_argument("--redis-url", help="the gateway's limiter (default: in-process)")
    p.add_argument("--out", type=Path, default=RESULTS / "gateway-ttft.json")
    return p.parse_args(list(argv))


def default_model() -> Path:
    """The default model, as ``kvgate serve`` gets it (downloaded once under the var dir)."""
    from gateway.commands.default_model import ensure_default_model

    return ensure_default_model(Path(os.environ.get("KVGATE_VAR_DIR", "var")) / "models")


@dataclass(frozen=True)
class Conversation:
    system: str
    prefix_ids: tuple[int, ...]
    tokenizer: Any

    @classmethod
    def build(cls, model: Path, min_tokens: int) -> Conversation:
        """A tenant system prompt of policy sentences, at least ``min_tokens`` when rendered."""
        from engine.text import load_tokenizer
        from gateway.prompts.tenant_prefix import build_prefix

        tokenizer = load_tokenizer(model)
        sentences: list[str] = []
        while True:
            sentences.append(POLICY[len(sentences) % len(POLICY)])
            prefix = build_prefix(tokenizer, " ".join(sentences))
            if len(prefix.ids) >= min_tokens:
                return cls(" ".join(sentences), prefix.ids, tokenizer)

    @staticmethod
    def turn(i: int) -> str:
        return f"Where is my order {4700 + i}?"

    def prompt_ids(self, i: int) -> list[int]:
        """The ids the gateway sends the engine for turn ``i`` (its own assembly)."""
        from gateway.chat.prompt import assemble
        from gateway.chat.schemas import ChatMessage
        from gateway.prompts.tenant_prefix import build_prefix

        prefix = build_prefix(self.tokenizer, self.system)
        return assemble(self.tokenizer, prefix, [ChatMessage(role="user", content=self.turn(i))])


class Serve:
    """``kvgate serve`` in a subprocess on a free loopback port, its state in ``workdir``."""

    def __init__(self, model: Path, workdir: Path, redis_url: str | None) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        env = dict(os.environ)
        env |= {
            "KVGATE_MODEL": str(model),
            "KVGATE_MODEL_NAME": MODEL_NAME,
            "KVGATE_VAR_DIR": str(workdir),
            "KVGATE_ADMIN_TOKEN": ADMIN_TOKEN,
            "KVGATE_METRICS_PORT": "0",
            "KVGATE_LOG_LEVEL": "warning",  # no request log line: the request path only
        }
        env.pop("KVGATE_DATABASE_URL", None)
        env.pop("KVGATE_WORKERS", None)
        if redis_url:
            env["KVGATE_REDIS_URL"] = redis_url
        else:
            env.pop("KVGATE_REDIS_URL", None)
        self.log = workdir / "serve.log"
        cmd = [sys.executable, "-m", "gateway.cli", "serve", "--port", str(self.port)]
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        self._wait_listening()

    def _wait_listening(self, limit_s: float = 600.0) -> None:
        deadline = time.monotonic() + limit_s
        while "listening on" not in self.log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"kvgate serve did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)

    def call(self, method: str, path: str, body: dict[str, Any], token: str) -> Any:
        hdrs = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        url = f"http://127.0.0.1:{self.port}{path}"
        req = urllib.request.Request(url, json.dumps(body).encode(), hdrs, method=method)
        with urllib.request.urlopen(req, timeout=120) as resp:
            return json.loads(resp.read())

    def tenant(self, system: str) -> str:
        """A tenant with ``system`` as its prompt (pinned when it activates); its server key."""
        limits = {"rpm": 10_000_000, "tpm": 1_000_000_000, "max_concurrency": 100}
        body = {"id": "bench", "name": "bench", "system_prompt": system, "limits": limits}
        self.call("POST", "/admin/v1/tenants", body, ADMIN_TOKEN)
        key = self.call("POST", "/admin/v1/tenants/bench/keys", {"kind": "server"}, ADMIN_TOKEN)
        return str(key["key"])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass(frozen=True)
class Streamed:
    role_s: float  # first SSE event (the role chunk)
    content_s: float  # first event with content
    prompt_tokens: int
    cached_tokens: int


class RawClient:
    """One keep-alive HTTP/1.1 connection, bytes on a plain socket (TCP_NODELAY): nothing
    between the wire and the clock but the kernel."""

    def __init__(self, port: int, key: str) -> None:
        self.port, self.key = port, key
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def chat(self, content: str, max_tokens: int) -> Streamed:
        body = json.dumps(
            {
                "model": MODEL_NAME,
                "messages": [{"role": "user", "content": content}],
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        ).encode()
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {self.key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        self.sock.sendall(head.encode() + body)
        t0 = time.perf_counter()
        return self._read(t0)

    def _read(self, t0: float) -> Streamed:
        """The response, de-chunked as it arrives; events timed at the recv that completed them."""
        buf, events = b"", _Events()
        headers_done = False
        while not events.ended:  # read to the last chunk: the connection is reused
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("kvgate serve closed the connection")
            now = time.perf_counter() - t0
            buf += data
            if not headers_done:
                if b"\r\n\r\n" not in buf:
                    continue
                head, buf = buf.split(b"\r\n\r\n", 1)
                if not head.startswith(b"HTTP/1.1 200"):
                    raise RuntimeError(f"gateway answered {head[:200]!r}")
                headers_done = True
            buf = events.feed(buf, now)
        assert events.role_s is not None and events.content_s is not None, "no content streamed"
        return Streamed(events.role_s, events.content_s, events.prompt, events.cached)


class _Events:
    """Chunked transfer decoding, then SSE events: what arrived when."""

    def __init__(self) -> None:
        self.sse = b""
        self.role_s: float | None = None
        self.content_s: float | None = None
        self.prompt = self.cached = 0
        self.done = False  # [DONE] seen
        self.ended = False  # the last (empty) chunk seen

    def feed(self, buf: bytes, now: float) -> bytes:
        """Consume whole chunks of ``buf``; returns what is left."""
        while b"\r\n" in buf:
            size_line, rest = buf.split(b"\r\n", 1)
            size = int(size_line, 16)
            if len(rest) < size + 2:
                break
            self.ended = size == 0
            self.sse += rest[:size]
            buf = rest[size + 2 :]
        while b"\n\n" in self.sse:
            event, self.sse = self.sse.split(b"\n\n", 1)
            self._event(event.removeprefix(b"data: "), now)
        return buf

    def _event(self, data: bytes, now: float) -> None:
        if data == b"[DONE]":
            self.done = True
            return
        obj = json.loads(data)
        if obj.get("usage"):
            self.prompt = obj["usage"]["prompt_tokens"]
            self.cached = obj["usage"]["prompt_tokens_details"]["cached_tokens"]
        for choice in obj["choices"]:
            if self.role_s is None:
                self.role_s = now
            if choice["delta"].get("content") and self.content_s is None:
                self.content_s = now


class EngineSide:
    """The engine's own TTFT, as ``kvgate bench model`` takes it: the system prompt pinned, one
    greedy token of a new turn through ``Engine.generate``."""

    def __init__(self, model: Path, prefix_ids: Sequence[int], threads: int) -> None:
        import torch

        from engine.params import SamplingParams
        from engine.serving.engine import Engine

        torch.set_num_threads(threads)
        self.engine = Engine.from_pretrained(model, kv_cache_bytes=256 << 20)
        self.engine.pin_prefix("tenant", list(prefix_ids))
        self.one = SamplingParams(temperature=0.0, max_tokens=1)

    def ttft(self, ids: list[int]) -> tuple[float, int]:
        t0 = time.perf_counter()
        out = self.engine.generate([ids], self.one, namespace="tenant")[0]
        return time.perf_counter() - t0, out.num_cached_tokens


def _pairs(
    client: RawClient, engine: EngineSide, convo: Conversation, args: argparse.Namespace, first: int
) -> dict[str, list[float]]:
    t: dict[str, list[float]] = {"gateway": [], "role": [], "engine": []}
    for j in range(args.requests):
        i = first + j
        ids = convo.prompt_ids(i)
        cached: dict[str, int] = {}
        sides = ("gateway", "engine") if j % 2 == 0 else ("engine", "gateway")
        for side in sides:
            if side == "engine":
                s, cached["engine"] = engine.ttft(ids)
                t["engine"].append(s)
                continue
            r = client.chat(convo.turn(i), args.max_tokens)
            assert r.prompt_tokens == len(ids), (r.prompt_tokens, len(ids))
            cached["gateway"] = r.cached_tokens
            t["gateway"].append(r.content_s)
            t["role"].append(r.role_s)
        # the same work on both sides: the same prompt, the same tokens from cache
        assert cached["gateway"] == cached["engine"], cached
    return t


def _repeat_summary(t: dict[str, list[float]]) -> dict[str, float]:
    diffs = [g - e for g, e in zip(t["gateway"], t["engine"], strict=True)]
    gap = [c - r for c, r in zip(t["gateway"], t["role"], strict=True)]

    def p90(xs: list[float]) -> float:
        return statistics.quantiles(xs, n=10)[-1]

    return {
        "engine_p50_ms": statistics.median(t["engine"]) * 1e3,
        "engine_p90_ms": p90(t["engine"]) * 1e3,
        "gateway_p50_ms": statistics.median(t["gateway"]) * 1e3,
        "gateway_p90_ms": p90(t["gateway"]) * 1e3,
        "added_p50_ms": statistics.median(diffs) * 1e3,
        "added_p90_ms": p90(diffs) * 1e3,
        "role_chunk_p50_ms": statistics.median(t["role"]) * 1e3,
        "role_to_content_p50_ms": statistics.median(gap) * 1e3,
    }


def _spread(reps: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    return {
        k: {
            "median": statistics.median(r[k] for r in reps),
            "min": min(r[k] for r in reps),
            "max": max(r[k] for r in reps),
        }
        for k in reps[0]
    }


def host() -> dict[str, Any]:
    from engine.runtime.cpu_isa import native_bf16, vector_flags

    return {
        "cpu": cpu_model(),
        "cpu_flags": vector_flags(),
        "native_bf16": native_bf16(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    model = args.model or default_model()
    convo = Conversation.build(model, args.tenant_prompt)
    threads = torch.get_num_threads()  # the worker's: torch's default in its own process
    with tempfile.TemporaryDirectory(prefix="kvgate-bench-ttft-") as tmp:
        serve = Serve(model, Path(tmp), args.redis_url)
        try:
            key = serve.tenant(convo.system)
            engine = EngineSide(model, convo.prefix_ids, threads)
            client = RawClient(serve.port, key)  # after the engine loaded: no idle keep-alive
            load_before = os.getloadavg()
            _pairs(client, engine, convo, argparse.Namespace(**{**vars(args), "requests": 6}), 0)
            reps = []
            for r in range(args.repeats):
                t = _pairs(client, engine, convo, args, 100 + r * args.requests)
                reps.append(_repeat_summary(t))
                row = reps[-1]
                print(
                    f"repeat {r + 1}: engine {row['engine_p50_ms']:.1f} ms, gateway "
                    f"{row['gateway_p50_ms']:.1f} ms (role chunk {row['role_chunk_p50_ms']:.1f}),"
                    f" added p50 {row['added_p50_ms']:+.1f} p90 {row['added_p90_ms']:+.1f} ms",
                    flush=True,
                )
            load_after = os.getloadavg()
        finally:
            serve.stop()
    ids = convo.prompt_ids(0)
    config = {
        "benchmark": "gateway --only ttft",
        "model": model.name,
        "tenant_prompt_tokens": len(convo.prefix_ids),
        "turn_tokens": len(ids) - len(convo.prefix_ids),
        "gateway": "kvgate serve (local worker over its Unix socket), "
        + ("Redis limiter" if args.redis_url else "in-process limiter"),
        "client": "raw socket, keep-alive, TCP_NODELAY; first SSE event with content",
        "engine": "Engine.generate, max_tokens=1, system prompt pinned (kvgate bench model)",
        "threads": threads,
        "requests_per_repeat": args.requests,
        "repeats": args.repeats,
        "max_tokens": args.max_tokens,
        "target": f"gateway p50 <= engine p50 + {TARGET_MS} ms",
        "load_average_before": load_before,
        "load_average_after": load_after,
        **host(),
    }
    results: dict[str, Any] = _spread(reps)
    results["repeats"] = reps
    added = results["added_p50_ms"]["median"]
    results["within_target"] = added <= TARGET_MS
    return {"config": config, "results": results}


def main(argv: Sequence[str]) -> int:
    args = parse(argv)
    out = run(args)
    r = out["results"]
    print(json.dumps(out["config"], indent=2))
    print("| | p50 ms (min-max over repeats) | p90 ms |")
    print("| --- | --- | --- |")
    for name in ("engine", "gateway", "added"):
        p50, p90 = r[f"{name}_p50_ms"], r[f"{name}_p90_ms"]["median"]
        print(f"| {name} | {p50['median']:.1f} ({p50['min']:.1f}-{p50['max']:.1f}) | {p90:.1f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0
