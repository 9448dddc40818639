"""``kvgate bench bounds``: what the largest requests the bounds allow cost the gateway
(gateway/chat/bounds.py).

    logprobs   peak Python memory (tracemalloc, the whole gateway process: handler, engine
               outputs, JSON) of the largest non-streamed logprobs answers allowed
               (n x max_tokens x (top_logprobs + 1) = the bound), through a live gateway on the
               demo model; EOS is banned so every choice runs to max_tokens
    stops      event-loop time of one stop-matcher feed (one token of one choice): 4 stops of
               the longest allowed length vs 4 stops filling a 1 MiB body (no cap, as before)
    choices    event-loop time of folding one engine step of n=128 choices into the group's
               usage: O(1) per update vs the former recomputation over all choices
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import timeit
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

RESULTS = Path(__file__).resolve().parent / "results"
ADMIN_TOKEN = "bench-admin-token-0123456789"
# (n, max_tokens, top_logprobs): each at the bound of 131,072 entries (the demo model's context
# is 4096 tokens, so one choice with 20 alternatives reaches 86,016 at most)
SHAPES = ((128, 1024, 0), (32, 195, 20), (4, 1560, 20))


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvgate bench bounds", description=__doc__)
    p.add_argument("--out", type=Path, default=RESULTS / "bounds.json")
    p.add_argument("--skip-logprobs", action="store_true", help="only the loop timings")
    return p.parse_args(argv)


async def _gateway(tmp: Path) -> tuple[Any, Any, str, str]:
    """(app, runner, base url, server key) of a gateway on the demo model and SQLite."""
    from aiohttp import web

    from engine.runtime.model.demo import write_demo_model
    from gateway.app import create_app
    from gateway.settings import Settings
    from tenants.migrate import upgrade_to_head

    model_dir = write_demo_model(tmp / "demo-model")
    db = f"sqlite+aiosqlite:///{tmp}/bounds.db"
    await upgrade_to_head(db)
    env = {
        "KVGATE_DATABASE_URL": db,
        "KVGATE_ADMIN_TOKEN": ADMIN_TOKEN,
        "KVGATE_VAR_DIR": str(tmp / "var"),
        "KVGATE_DEVICE": "cpu",
        "KVGATE_METRICS_PORT": "0",
        "KVGATE_KV_CACHE_BYTES": str(1 << 30),  # 128 x 1 k tokens of the demo model: 0.5 GiB
    }
    app = create_app(Settings.from_env(env), model_dir=str(model_dir))
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    url = f"http://{host}:{port}"
    hdrs = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    limits = {"max_output_tokens": 4096, "tpm": 10**8, "rpm": 10**4, "max_concurrency": 1000}
    async with aiohttp.ClientSession() as http:
        body = {"id": "bounds", "name": "bounds", "limits": limits}
        async with http.post(f"{url}/admin/v1/tenants", json=body, headers=hdrs) as r:
            assert r.status == 201, await r.text()
        async with http.post(
            f"{url}/admin/v1/tenants/bounds/keys", json={"kind": "server"}, headers=hdrs
        ) as r:
            key = (await r.json())["key"]
    return app, runner, url, key


async def _logprobs_peak(url: str, key: str, app: Any, shape: tuple[int, int, int]) -> dict:
    from gateway.context import STATE

    n, max_tokens, top = shape
    eos = app[STATE].tokenizer.eos_token_ids
    body = {
        "model": app[STATE].model_name,
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "n": n,
        "max_tokens": max_tokens,
        "logprobs": True,
        "top_logprobs": top,
        "logit_bias": {str(t): -100 for t in eos},  # every choice runs to max_tokens
    }
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as http:
        tracemalloc.start()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        started = time.monotonic()
        size = 0
        async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as r:
            assert r.status == 200, await r.text()
            async for chunk in r.content.iter_chunked(1 << 16):  # the client keeps nothing
                size += len(chunk)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    entries = n * max_tokens * (top + 1)
    return {
        "n": n,
        "max_tokens": max_tokens,
        "top_logprobs": top,
        "entries": entries,
        "peak_mib": round((peak - base) / 2**20, 1),
        "bytes_per_entry": round((peak - base) / entries),
        "response_mib": round(size / 2**20, 1),
        "seconds": round(time.monotonic() - started, 1),
    }


def _old_feed(buffer: str, text: str, stops: Sequence[str], hold: int) -> str:
    """The matcher as it was: every stop searched over the whole held tail + the new text."""
    buf = buffer + text
    hits = [i for i in (buf.find(s) for s in stops) if i >= 0]
    assert not hits
    return buf[max(0, len(buf) - hold) :]


def _stops_us() -> dict[str, float]:
    from gateway.chat.bounds import MAX_STOP_CHARS, MAX_STOP_SEQUENCES
    from gateway.chat.stops import StopMatcher

    token = "lorem "
    capped = [("q" * (MAX_STOP_CHARS - 1)) + str(i) for i in range(MAX_STOP_SEQUENCES)]
    m = StopMatcher(capped)
    m.feed(token * 100)
    new_us = min(timeit.repeat(lambda: m.feed(token), number=2000, repeat=5)) / 2000 * 1e6
    huge = [("q" * (256 * 1024 - 1)) + str(i) for i in range(4)]  # 4 x 256 KiB: a 1 MiB body
    hold = 256 * 1024 - 1
    tail = _old_feed("", token * 50_000, huge, hold)
    old_us = min(timeit.repeat(lambda: _old_feed(tail, token, huge, hold), number=50, repeat=5))
    return {"capped_feed_us": round(new_us, 2), "uncapped_feed_us": round(old_us / 50 * 1e6, 1)}


def _choices_ms(n: int = 128) -> dict[str, float]:
    """One engine step of n choices: each choice reports twice (tokens, then their time)."""
    from engine.api import GenerateOptions
    from engine.params import SamplingParams
    from gateway.chat.generation import ChoiceGroup

    group = ChoiceGroup(
        None,  # type: ignore[arg-type]  # never started: only the stats fold is timed
        None,  # type: ignore[arg-type]
        [1, 2, 3],
        SamplingParams(),
        GenerateOptions("ns", "r"),
        n=n,
    )
    for c in group.choices:
        c.stats.completion_tokens, c.stats.first_token_at = 10, 1.0

    def step() -> None:
        for c in group.choices:
            c.stats.completion_tokens += 1
            group._refresh(c)
            c.stats.last_token_at = time.monotonic()
            group._refresh(c)

    def old_refresh() -> None:  # the recomputation over all choices, as it was
        all_stats = [c.stats for c in group.choices]
        s = group.stats
        s.completion_tokens = sum(c.completion_tokens for c in all_stats)
        firsts = [c.first_token_at for c in all_stats if c.first_token_at is not None]
        lasts = [c.last_token_at for c in all_stats if c.last_token_at is not None]
        s.first_token_at, s.last_token_at = min(firsts), max(lasts)

    def old_step() -> None:
        for _ in range(2 * n):
            old_refresh()

    new = min(timeit.repeat(step, number=20, repeat=5)) / 20 * 1e3
    old = min(timeit.repeat(old_step, number=5, repeat=5)) / 5 * 1e3
    return {"n": n, "fold_per_step_ms": round(new, 3), "recompute_per_step_ms": round(old, 2)}


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"stops": _stops_us(), "choices": _choices_ms()}
    if args.skip_logprobs:
        return out
    with tempfile.TemporaryDirectory() as tmp:
        app, runner, url, key = await _gateway(Path(tmp))
        try:
            out["logprobs"] = [await _logprobs_peak(url, key, app, s) for s in SHAPES]
        finally:
            await runner.cleanup()
    return out


def main(argv: Sequence[str]) -> int:
    args = _parse(argv)
    results = asyncio.run(_run(args))
    print(json.dumps(results, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0
