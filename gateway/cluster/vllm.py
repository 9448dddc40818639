"""Opening the cluster over vLLM servers (``KVGATE_BACKEND=vllm``): the same ``ClusterEngine``
(placement, pin-aware routing, KV index, health, failover, the cluster view), its replicas
``VllmClient``s (engine/remote/vllm_client.py) instead of kvgate workers.

    KVGATE_WORKERS       the servers' base URLs (http://host:port, comma-separated)
    KVGATE_MODEL         the checkpoint directory they serve: the gateway reads its tokenizer
                         and chat template only (no weights), renders and tokenizes as always
    KVGATE_KV_EVENTS     each server's KV-event endpoint, in KVGATE_WORKERS order (optional;
                         else each server's GET /kv_event_sources); ``ENDPOINT|REPLAY`` names
                         its replay socket too
    KVGATE_WORKER_TOKEN  sent as the servers' API key (vLLM's --api-key); unset: none

The model's context length and block size come from the first server that answers.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp

from engine.api import CacheScope
from engine.remote.kv_subscriber import KVEventEndpoint
from engine.remote.messages import WorkerInfo
from engine.remote.replica import ReplicaClient
from engine.remote.vllm_client import VllmClient
from engine.remote.vllm_wire import VLLM_GRAMMARS, vllm_salt
from engine.text import load_tokenizer
from gateway.cluster.bootstrap import POLL_S, REQUEST_TIMEOUT_S, ClusterSource, ClusterUnavailable
from gateway.cluster.discovery import parse_workers
from gateway.cluster.engine import ClusterEngine
from gateway.settings import Settings


def vllm_index_keys(namespace: str, scope: CacheScope | None) -> tuple[str, CacheScope | None]:
    """A vLLM server's blocks are keyed under the request's salt, with no scope."""
    return vllm_salt(namespace, scope), None


def parse_kv_events(raw: str | None, urls: tuple[str, ...]) -> dict[str, KVEventEndpoint]:
    """KVGATE_KV_EVENTS by server URL; its entries must match KVGATE_WORKERS one for one."""
    if not raw:
        return {}
    items = [p.strip() for p in raw.split(",") if p.strip()]
    if len(items) != len(urls):
        raise ClusterUnavailable(
            f"KVGATE_KV_EVENTS names {len(items)} endpoints for {len(urls)} KVGATE_WORKERS"
        )
    out = {}
    for url, item in zip(urls, items, strict=True):
        endpoint, _, replay = item.partition("|")
        for ep in (endpoint, replay):
            if ep and not ep.startswith(("tcp://", "ipc://")):
                raise ClusterUnavailable(f"KVGATE_KV_EVENTS: {ep!r}: expected tcp://host:port")
        out[url] = KVEventEndpoint(url, endpoint, replay or None)
    return out


@dataclass(frozen=True)
class VllmSource:
    settings: Settings
    endpoints: tuple[str, ...]
    token: str | None
    model_dir: str
    kv_events: dict[str, KVEventEndpoint]

    @classmethod
    def from_settings(cls, settings: Settings, model_dir: str | None) -> VllmSource:
        """Checks the configuration only (no I/O)."""
        cs = settings.cluster
        if not cs.workers:
            raise ClusterUnavailable("KVGATE_BACKEND=vllm needs KVGATE_WORKERS (the servers)")
        if model_dir is None:
            raise ClusterUnavailable("KVGATE_BACKEND=vllm needs KVGATE_MODEL (their checkpoint)")
        try:
            endpoints = parse_workers(cs.workers)
        except ValueError as exc:
            raise ClusterUnavailable(f"KVGATE_WORKERS: {exc}") from None
        events = parse_kv_events(cs.kv_events, endpoints)
        return cls(settings, endpoints, cs.worker_token, model_dir, events)

    def connect(self, url: str, session: aiohttp.ClientSession, timeout: float) -> ReplicaClient:
        return VllmClient(
            url,
            self.token,
            session,
            timeout,
            kv_events=self.kv_events.get(url),
            priority=self.settings.cluster.backend_priority,
            rewarm_recent_s=self.settings.cluster.rewarm_recent_s,
        )

    async def open_cluster(self) -> ClusterEngine:
        """The tokenizer from the model directory (off the loop), the model's facts from the
        first server that answers; the cluster client, not started."""
        cs = self.settings.cluster
        tokenizer = await asyncio.to_thread(load_tokenizer, self.model_dir)
        info = await self.first_info(cs.connect_timeout_s)
        return ClusterEngine(
            self.endpoints,
            self.token or "",
            tokenizer=tokenizer,
            info=info,
            health_s=cs.health_s,
            spill_queue_s=cs.spill_queue_s,
            replica_rate=cs.replica_rps,
            load_stats=ClusterSource.load_stats(self.settings),
            connect=self.connect,
            index_keys=vllm_index_keys,
            grammars=VLLM_GRAMMARS,
            dispatch=ClusterSource.dispatcher(self.settings),
        )

    async def first_info(self, timeout_s: float) -> WorkerInfo:
        deadline = time.monotonic() + timeout_s
        last = ""
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while True:
                for url in self.endpoints:
                    try:
                        return await VllmClient(url, self.token, http, REQUEST_TIMEOUT_S).info()
                    except Exception as exc:  # any failure: try the next, until the deadline
                        last = str(exc) or type(exc).__name__
                if time.monotonic() > deadline:
                    why = f"no vLLM server answered in {timeout_s:.0f} s: {last}"
                    raise ClusterUnavailable(why)
                await asyncio.sleep(POLL_S)
