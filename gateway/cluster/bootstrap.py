"""Opening the cluster engine from settings, before the event loop runs (like loading a model).

    KVGATE_WORKERS set     -> those workers (a host name may stand for several)
    unset (kvgate serve)   -> one local worker process started here (gateway/cluster/local.py)

The gateway needs the tokenizer and the model's context length to build the app; both come from
the first worker that answers (``/v1/info``, ``/v1/tokenizer``), so gateways need no model files.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request

from engine.worker.messages import TokenizerPayload, WireError, WorkerInfo, from_json
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
        tokenizer=payload.build(),
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
) -> tuple[WorkerInfo, TokenizerPayload]:
    """Info and tokenizer from the first endpoint that answers, retrying until ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while True:
        for url in endpoints:
            try:
                info = from_json(_get(url, "/v1/info", token), WorkerInfo)
                return info, from_json(_get(url, "/v1/tokenizer", token), TokenizerPayload)
            except (OSError, urllib.error.URLError, WireError) as exc:
                last = exc
        if time.monotonic() > deadline:
            raise ClusterUnavailable(f"no worker answered in {timeout_s:.0f} s: {last}")
        time.sleep(0.5)


def _get(url: str, path: str, token: str) -> bytes:
    req = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=5.0) as resp:
        body: bytes = resp.read()
        return body
