"""Worker processes on loopback for the cluster tests (the demo model, a small KV cache)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from gateway.cluster.bootstrap import fetch_bootstrap
from gateway.cluster.engine import ClusterEngine
from gateway.cluster.loadstats import LoadStats
from gateway.cluster.local import LocalWorker

TOKEN = "test-worker-token-0123456789abcdef"  # KVGATE_WORKER_TOKEN: 32+ characters
KV_CACHE_BYTES = 8 << 20  # demo model: 128 blocks of 16 tokens; pin budget 64 blocks


def worker_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    env.update(
        KVGATE_DEVICE="cpu",
        KVGATE_KV_CACHE_BYTES=str(KV_CACHE_BYTES),
        KVGATE_LOG_LEVEL="warning",
        KVGATE_KV_SNAPSHOT_DIR="off",  # never write into or restore from the repository's var/
        **extra,
    )
    return env


def start_workers(
    model_dir: Path, ids: list[str], env: dict[str, str] | None = None
) -> list[LocalWorker]:
    """Start the workers in parallel (each imports torch and loads the model); ``env``: a
    ``worker_env(...)`` for other settings."""
    env = worker_env() if env is None else env
    return LocalWorker.start_many(str(model_dir), ids, TOKEN, env, 120)


async def stop_all(workers: list[LocalWorker]) -> None:
    await asyncio.gather(*(w.stop() for w in workers))


def stop_workers(workers: list[LocalWorker]) -> None:
    asyncio.run(stop_all(workers))


async def cluster_engine(workers: list[LocalWorker], **kwargs: Any) -> ClusterEngine:
    urls = tuple(w.url for w in workers)
    info, payload = await fetch_bootstrap(urls, TOKEN, 10.0)
    kwargs.setdefault("health_s", 0.3)
    stats = LoadStats(None, "", kwargs.pop("load_window_s", 10.0))
    tokenizer = payload.build()
    return ClusterEngine(urls, TOKEN, tokenizer=tokenizer, info=info, load_stats=stats, **kwargs)
