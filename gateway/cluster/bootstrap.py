"""Opening the cluster engine from settings, before the event loop runs (like loading a model).

    KVGATE_WORKERS set     -> those workers (a host name may stand for several)
    unset (kvgate serve)   -> one local worker process started here (gateway/cluster/local.py)

The gateway needs the tokenizer and the model's context length to build the app; both come from
the first worker that answers (``/v1/info``, ``/v1/tokenizer``), so gateways need no model files.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from engine.model.tokenizer import Tokenizer
from gateway.cluster.client import WorkerInfo
from gateway.cluster.discovery import parse_workers
from gateway.cluster.engine import ClusterEngine
from gateway.cluster.loadstats import LoadStats
from gateway.cluster.local import LocalWorker
from gateway.settings import Settings


class ClusterUnavailable(RuntimeError):
    """No worker answered within the start-up timeout."""


def open_cluster(
    settings: Settings, model_dir: str | None, *, local_unix: bool = True
) -> ClusterEngine:
    """``local_unix``: the local worker's generate streams go over a Unix domain socket."""
    cs = settings.cluster
    local: LocalWorker | None = None
    if cs.workers:
        endpoints, token = parse_workers(cs.workers), cs.worker_token or ""
        if not token:
            raise ClusterUnavailable("KVGATE_WORKERS is set but KVGATE_WORKER_TOKEN is not")
    else:
        if model_dir is None:
            raise ValueError("no model: set KVGATE_MODEL or pass model_dir")
        local = LocalWorker.start(model_dir, cs.connect_timeout_s, unix=local_unix)
        endpoints, token = (local.url,), local.token
    try:
        info, payload = fetch_bootstrap(endpoints, token, cs.connect_timeout_s)
    except BaseException:
        if local is not None:
            local.proc.kill()
        raise
    redis = None
    if settings.ratelimit.redis_url:
        from gateway.ratelimit import make_client

        redis = make_client(settings.ratelimit.redis_url, settings.ratelimit.redis_timeout_s)
    # a bucket is final once every gateway has flushed into it: a health round or two
    settle_s = 2 * cs.health_s + 1.0
    stats = LoadStats(redis, settings.ratelimit.redis_prefix, cs.load_window_s, settle_s=settle_s)
    return ClusterEngine(
        endpoints,
        token,
        tokenizer=tokenizer_from_payload(payload),
        info=info,
        health_s=cs.health_s,
        spill_queue_s=cs.spill_queue_s,
        replica_rate=cs.replica_rps,
        load_stats=stats,
        on_close=local.stop if local is not None else None,
        unix_paths={local.url: local.unix_path} if local is not None and local.unix_path else None,
    )


def fetch_bootstrap(
    endpoints: tuple[str, ...], token: str, timeout_s: float
) -> tuple[WorkerInfo, dict[str, Any]]:
    """Info and tokenizer from the first endpoint that answers, retrying until ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while True:
        for url in endpoints:
            try:
                d = _get(url, "/v1/info", token)
                info = WorkerInfo(**{k: d[k] for k in WorkerInfo.__dataclass_fields__})
                return info, _get(url, "/v1/tokenizer", token)
            except (OSError, urllib.error.URLError, ValueError, KeyError) as exc:
                last = exc
        if time.monotonic() > deadline:
            raise ClusterUnavailable(f"no worker answered in {timeout_s:.0f} s: {last}")
        time.sleep(0.5)


def _get(url: str, path: str, token: str) -> Any:
    req = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=5.0) as resp:
        return json.loads(resp.read())


def tokenizer_from_payload(payload: dict[str, Any]) -> Tokenizer:
    from tokenizers import Tokenizer as Backend

    config: dict[str, Any] = {"add_bos_token": bool(payload["add_bos"])}
    if payload.get("chat_template") is not None:
        config["chat_template"] = payload["chat_template"]
    config.update({k: v for k, v in payload["special_tokens"].items() if v is not None})
    backend = Backend.from_str(payload["backend"])
    return Tokenizer(backend, config, [int(t) for t in payload["eos_token_ids"]])
