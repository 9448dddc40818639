"""Opening the cluster engine: chosen from settings when the app is built, opened in its
``cleanup_ctx`` (gateway/lifecycle/engine_source.py), never before the event loop runs.

    KVGATE_WORKERS set     -> those workers (a host name may stand for several)
    unset (kvgate serve)   -> one local worker process started at open (gateway/cluster/local.py)

The gateway needs the tokenizer and the model's context length; both come from the first worker
that answers (``/v1/info``, ``/v1/tokenizer``), polled with aiohttp until the start-up timeout,
so gateways need no model files. A local worker whose cluster does not open is stopped again.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp

from engine.remote.messages import TokenizerPayload, WireError, WorkerInfo, from_json
from gateway.cluster.discovery import parse_workers
from gateway.cluster.dispatch import Dispatcher
from gateway.cluster.engine import ClusterEngine
from gateway.cluster.loadstats import LoadStats
from gateway.cluster.local import LocalWorker
from gateway.settings import Settings

POLL_S = 0.5  # between rounds over the endpoints while none answers
REQUEST_TIMEOUT_S = 5.0  # one info or tokenizer request


class ClusterUnavailable(RuntimeError):
    """No worker answered within the start-up timeout (or the cluster is misconfigured)."""


@dataclass(frozen=True)
class ClusterSource:
    """The workers to open: ``endpoints`` with ``token``, or none (a local worker for
    ``model_dir``, its generate streams over a Unix socket when ``local_unix``)."""

    settings: Settings
    endpoints: tuple[str, ...]
    token: str
    model_dir: str | None
    local_unix: bool = True

    @classmethod
    def from_settings(
        cls, settings: Settings, model_dir: str | None, *, local_unix: bool = True
    ) -> ClusterSource:
        """Checks the configuration only (no I/O); the errors ``create_app`` raises."""
        cs = settings.cluster
        if cs.workers:
            endpoints, token = parse_workers(cs.workers), cs.worker_token or ""
            if not token:
                raise ClusterUnavailable("KVGATE_WORKERS is set but KVGATE_WORKER_TOKEN is not")
            return cls(settings, endpoints, token, model_dir, local_unix)
        if model_dir is None:
            raise ValueError("no model: set KVGATE_MODEL or pass model_dir")
        return cls(settings, (), "", model_dir, local_unix)

    async def open_cluster(self) -> ClusterEngine:
        """Start the local worker (if any; a thread waits for it, not the event loop), fetch
        the tokenizer and model facts, and build the (not started) cluster client."""
        cs = self.settings.cluster
        local: LocalWorker | None = None
        endpoints, token = self.endpoints, self.token
        if not endpoints:
            assert self.model_dir is not None
            local = await asyncio.to_thread(
                LocalWorker.start, self.model_dir, cs.connect_timeout_s, unix=self.local_unix
            )
            endpoints, token = (local.url,), local.token
        try:
            info, payload = await fetch_bootstrap(endpoints, token, cs.connect_timeout_s)
            tokenizer = payload.build()
        except BaseException:  # a failed or cancelled start-up leaves no worker behind
            if local is not None:
                local.proc.kill()
                await local.stop()
            raise
        return ClusterEngine(
            endpoints,
            token,
            tokenizer=tokenizer,
            info=info,
            health_s=cs.health_s,
            spill_queue_s=cs.spill_queue_s,
            replica_rate=cs.replica_rps,
            load_stats=self.load_stats(self.settings),
            on_close=local.stop if local is not None else None,
            unix_paths=_unix_paths(local),
            dispatch=self.dispatcher(self.settings),
        )

    @staticmethod
    def dispatcher(settings: Settings) -> Dispatcher:
        """Admission in front of the replicas (any kind): the gateway's bound per replica
        (KVGATE_BACKEND_MAX_INFLIGHT), the engine's fair-share knobs."""
        engine = settings.model.engine
        return Dispatcher(
            settings.cluster.backend_max_inflight,
            engine.batch_max_wait_steps,
            engine.max_waiting,
        )

    @staticmethod
    def load_stats(settings: Settings) -> LoadStats:
        """Tenant request rates, shared through Redis when the gateway has one."""
        cs = settings.cluster
        redis = None
        if settings.ratelimit.redis_url:
            from gateway.ratelimit import make_client

            redis = make_client(settings.ratelimit.redis_url, settings.ratelimit.redis_timeout_s)
        # a bucket is final once every gateway has flushed into it: a health round or two
        settle_s = 2 * cs.health_s + 1.0
        return LoadStats(
            redis, settings.ratelimit.redis_prefix, cs.load_window_s, settle_s=settle_s
        )


def _unix_paths(local: LocalWorker | None) -> dict[str, str] | None:
    if local is None or local.unix_path is None:
        return None
    return {local.url: local.unix_path}


async def open_cluster(
    settings: Settings, model_dir: str | None, *, local_unix: bool = True
) -> ClusterEngine:
    """``ClusterSource.from_settings(...).open_cluster()``: the cluster engine, not started."""
    return await ClusterSource.from_settings(
        settings, model_dir, local_unix=local_unix
    ).open_cluster()


async def fetch_bootstrap(
    endpoints: tuple[str, ...], token: str, timeout_s: float
) -> tuple[WorkerInfo, TokenizerPayload]:
    """Info and tokenizer from the first endpoint that answers, retrying until ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    headers = {"Authorization": f"Bearer {token}"}
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as http:
        while True:
            for url in endpoints:
                try:
                    info = from_json(await _get(http, url + "/v1/info"), WorkerInfo)
                    payload = from_json(await _get(http, url + "/v1/tokenizer"), TokenizerPayload)
                    return info, payload
                except (aiohttp.ClientError, TimeoutError, WireError) as exc:
                    last = exc
            if time.monotonic() > deadline:
                why = str(last) or type(last).__name__
                raise ClusterUnavailable(f"no worker answered in {timeout_s:.0f} s: {why}")
            await asyncio.sleep(POLL_S)


async def _get(http: aiohttp.ClientSession, url: str) -> bytes:
    async with http.get(url) as resp:
        resp.raise_for_status()
        return await resp.read()
