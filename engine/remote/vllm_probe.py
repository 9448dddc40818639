"""What a vLLM server says of itself, read from its own routes (no torch).

GET /v1/models          the served model's name and ``max_model_len``
GET /metrics            ``vllm:cache_config_info`` (labels: ``block_size``,
                        ``num_gpu_blocks``), requests running / waiting, KV cache usage,
                        prefix-cache queries / hits, ``process_start_time_seconds``
GET /kv_event_sources   its KV-event publishers: ``{"0": {"endpoint", "replay_endpoint"}}``
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from engine.api import CacheStats

DEFAULT_BLOCK_SIZE = 16  # vLLM's default on GPUs, where /metrics does not name it


@dataclass(frozen=True, slots=True)
class ServerMetrics:
    block_size: int = DEFAULT_BLOCK_SIZE
    num_blocks: int = 0
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0  # fraction of the KV cache's blocks in use
    prefix_queries: int = 0
    prefix_hits: int = 0
    start_time: float | None = None  # the API server process's (a restart changes it)

    def cache_stats(self) -> CacheStats:
        used = round(self.num_blocks * self.kv_usage)
        return CacheStats(
            blocks_total=self.num_blocks,
            blocks_free=self.num_blocks - used,
            blocks_cached=0,
            blocks_in_use=used,
            blocks_pinned=0,
            blocks_pending=0,
            query_tokens=self.prefix_queries,
            hit_tokens=self.prefix_hits,
            evictions=0,
        )


def parse_metrics(text: str) -> ServerMetrics:
    """The figures the gateway uses out of vLLM's Prometheus text (summed over engines)."""
    got: dict[str, float] = {}
    block_size, num_blocks = DEFAULT_BLOCK_SIZE, 0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name.startswith("vllm:cache_config_info"):
                block_size = _int(sample.labels.get("block_size"), block_size)
                num_blocks = max(num_blocks, _int(sample.labels.get("num_gpu_blocks"), 0))
            elif name in _WANTED:
                got[name] = got.get(name, 0.0) + sample.value
    return ServerMetrics(
        block_size=block_size,
        num_blocks=num_blocks,
        running=int(got.get("vllm:num_requests_running", 0)),
        waiting=int(got.get("vllm:num_requests_waiting", 0)),
        kv_usage=got.get("vllm:kv_cache_usage_perc", 0.0),
        prefix_queries=int(got.get("vllm:prefix_cache_queries_total", 0)),
        prefix_hits=int(got.get("vllm:prefix_cache_hits_total", 0)),
        start_time=got.get("process_start_time_seconds"),
    )


_WANTED = frozenset(
    {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "process_start_time_seconds",
    }
)


def _int(raw: str | None, default: int) -> int:
    try:
        return int(raw) if raw not in (None, "", "None") else default
    except ValueError:
        return default


def served_model(models: object) -> tuple[str, int]:
    """(name, max_model_len) of the first model ``GET /v1/models`` lists."""
    if not isinstance(models, dict) or not isinstance(models.get("data"), list):
        raise ValueError("GET /v1/models: not a model list")
    first = models["data"][0] if models["data"] else None
    if not isinstance(first, dict) or not isinstance(first.get("id"), str):
        raise ValueError("GET /v1/models: no model served")
    return first["id"], int(first.get("max_model_len") or 0)


def event_sources(sources: object, base_url: str) -> tuple[str, str | None] | None:
    """(endpoint, replay endpoint) of rank 0's publisher as a subscriber reaches it: a publisher
    that binds ``*`` is connected to at the server's host; None when it lists none."""
    if not isinstance(sources, dict) or not sources:
        return None
    first = sources.get("0", next(iter(sources.values())))
    if not isinstance(first, dict) or not isinstance(first.get("endpoint"), str):
        return None
    host = urlsplit(base_url).hostname or "127.0.0.1"
    replay = first.get("replay_endpoint")
    replay_at = _reach(replay, host) if isinstance(replay, str) else None
    return _reach(first["endpoint"], host), replay_at


def _reach(endpoint: str, host: str) -> str:
    for wildcard in ("*", "0.0.0.0", "[::]"):
        if f"//{wildcard}:" in endpoint:
            return endpoint.replace(f"//{wildcard}:", f"//{host}:", 1)
    return endpoint
