"""A live kvgate gateway in front of the session's vLLM servers (``KVGATE_BACKEND=vllm``), on a
fresh copy of the migrated tenant database, for the backend tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from gateway.cluster.engine import ClusterEngine
from tests.gateway.harness import (
    LiveGateway,
    create_database,
    drop_database,
    live_gateway,
    make_settings,
    pg_url,
)
from tests.vllm.conftest import API_KEY
from tests.vllm.servers import VllmServer

# A system prompt of a few hundred tokens: two or more of vLLM's 128-token blocks
SYSTEM = (
    "You are the front desk of the Bexley Library. You answer questions about opening hours, "
    "membership, borrowing rules, the reading room, events for children and adults, printing, "
    "the café on the ground floor and accessibility. Keep answers short and friendly. "
) * 8


@contextlib.asynccontextmanager
async def vllm_gateway(
    template: str,
    servers: Sequence[VllmServer],
    model: Path,
    tmp_path: Path,
    *,
    kv_events: bool = True,
    **env: str,
) -> AsyncIterator[LiveGateway]:
    """The gateway over ``servers``; their KV events named in KVGATE_KV_EVENTS (else found at
    each server's GET /kv_event_sources)."""
    name = await create_database(template)
    try:
        variables = {
            "KVGATE_BACKEND": "vllm",
            "KVGATE_WORKERS": ",".join(s.base_url for s in servers),
            "KVGATE_WORKER_TOKEN": API_KEY,
            "KVGATE_MODEL": str(model),
            "KVGATE_WORKER_HEALTH_S": "0.5",
            "KVGATE_DEFAULT_MAX_TOKENS": "16",
            **env,
        }
        if kv_events:
            variables["KVGATE_KV_EVENTS"] = ",".join(
                f"{s.kv_endpoint}|{s.replay_endpoint}" for s in servers
            )
        settings = make_settings(pg_url(name), tmp_path, **variables)
        async with live_gateway(settings, model) as gw:
            yield gw
    finally:
        await drop_database(name)


def cluster_of(gw: LiveGateway) -> ClusterEngine:
    engine = gw.state.engine
    assert isinstance(engine, ClusterEngine)
    return engine


async def usage_records(gw: LiveGateway, tenant_id: str, count: int) -> list[dict[str, Any]]:
    """The tenant's ledger records, once ``count`` of them were written."""
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    stamp = "%Y-%m-%dT%H:00:00Z"
    window = {"start": (hour - timedelta(hours=1)).strftime(stamp)}
    window["end"] = (hour + timedelta(hours=2)).strftime(stamp)
    window["limit"] = "500"
    async with asyncio.timeout(60):
        while True:
            query = urlencode(window)
            page = await gw.admin("GET", f"/tenants/{tenant_id}/usage/records?{query}")
            if len(page["data"]) >= count:
                return list(page["data"])
            await asyncio.sleep(0.2)
