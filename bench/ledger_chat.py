"""The ledger's cost on a chat: p50 with the ledger on vs off, side by side in one run.

Two in-process gateways (the HTTP layer ``kvgate serve`` runs, the in-process limiter) share one
engine (the demo model, CPU) and the ledger's database; one has ``KVGATE_USAGE_LEDGER=true``
(records spooled, fsynced and written in batches on its event loop, as in production), the
other ``false``. Requests go in interleaved pairs, the order alternating pair by pair, so
machine noise hits both alike; reported: each side's p50, and the median and p90 of per-pair
differences (on - off), per repeat and overall.
"""

from __future__ import annotations

import secrets
import statistics
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

from bench.gateway import ADMIN_TOKEN, _make_tenant, _Setup, _start, _via_gateway, _WriteClock


async def chat_p50(
    database_url: str, *, pairs: int, repeats: int, max_tokens: int = 4
) -> dict[str, Any]:
    from engine import AsyncEngine
    from engine.runtime.model.demo import write_demo_model
    from gateway.settings import Settings

    with tempfile.TemporaryDirectory(prefix="kvgate-bench-ledger-chat-") as tmp:
        model_dir = write_demo_model(Path(tmp) / "demo-model")
        engine = AsyncEngine.from_pretrained(model_dir, device="cpu", kv_cache_bytes=64 << 20)
        setups: dict[str, _Setup] = {}
        try:
            key = secrets.token_hex(32)  # both gateways share the (fresh) database: one key
            for side in ("on", "off"):
                env = {
                    "KVGATE_DATABASE_URL": database_url,
                    "KVGATE_ADMIN_TOKEN": ADMIN_TOKEN,
                    "KVGATE_KEY_CACHE_TTL_S": "600",
                    "KVGATE_MODEL_NAME": "demo",
                    "KVGATE_VAR_DIR": f"{tmp}/var-{side}",
                    "KVGATE_SECRETS_KEY": key,
                    "KVGATE_USAGE_LEDGER": "true" if side == "on" else "false",
                }
                setups[side] = await _start(Settings.from_env(env), engine)
                async with aiohttp.ClientSession() as http:
                    await _make_tenant(setups[side], http, f"bench-ledger-{side}")
            undo = _WriteClock.install()
            try:
                return await _measure(setups, pairs, repeats, max_tokens)
            finally:
                undo()
        finally:
            for setup in reversed(list(setups.values())):
                await setup.runner.cleanup()


async def _measure(
    setups: dict[str, _Setup], pairs: int, repeats: int, max_tokens: int
) -> dict[str, Any]:
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}]}
    body |= {"max_tokens": max_tokens, "temperature": 0}
    on, off = setups["on"], setups["off"]
    per_repeat = []
    all_on: list[float] = []
    all_off: list[float] = []
    async with aiohttp.ClientSession() as http:
        for setup in (on, off):  # warm-up: connections, caches
            for _ in range(10):
                await _via_gateway(http, setup, body)
        for _ in range(repeats):
            t_on: list[float] = []
            t_off: list[float] = []
            for i in range(pairs):
                order = (on, off) if i % 2 == 0 else (off, on)
                for setup in order:
                    elapsed = (await _via_gateway(http, setup, body))[0]
                    (t_on if setup is on else t_off).append(elapsed)
            per_repeat.append(_summary(t_on, t_off))
            all_on += t_on
            all_off += t_off
    return {
        "pairs_per_repeat": pairs,
        "repeats": repeats,
        "max_tokens": max_tokens,
        **_summary(all_on, all_off),
        "per_repeat": per_repeat,
    }


def _summary(t_on: list[float], t_off: list[float]) -> dict[str, float]:
    diffs = [a - b for a, b in zip(t_on, t_off, strict=True)]
    return {
        "ledger_on_p50_ms": round(statistics.median(t_on) * 1e3, 3),
        "ledger_off_p50_ms": round(statistics.median(t_off) * 1e3, 3),
        "added_p50_ms": round(statistics.median(diffs) * 1e3, 3),
        "added_p90_ms": round(statistics.quantiles(diffs, n=10)[-1] * 1e3, 3),
    }
