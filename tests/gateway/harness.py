"""A live gateway on loopback for tests: fresh PostgreSQL database, demo model, admin client.

async with live_gateway(settings, model_dir) as gw:
    tenant = await gw.create_tenant("acme", system_prompt="...")
    client = gw.openai(tenant.key)          # openai.AsyncOpenAI against this server
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp import web
from openai import AsyncOpenAI
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from engine.remote.vllm_wire import VLLM_GRAMMARS
from engine.serving.async_engine import AsyncEngine
from gateway.app import create_app
from gateway.context import STATE, TELEMETRY
from gateway.http import GatewayRunner, make_runner
from gateway.settings import Settings
from gateway.telemetry import MetricsListener, metrics_listener
from tests.conformance.contract import ContractTransport, contract_client
from tests.tenants.fixtures import SECRETS_KEY

PG_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
ADMIN_TOKEN = "test-admin-token-0123456789"
KV_CACHE_BYTES = 8 << 20  # demo model: 8 MiB of KV is a few hundred 16-token blocks


async def wait_for(cond: Any, timeout: float = 5.0) -> None:
    """Poll ``cond`` until true: engine-thread effects (aborts, unpins) land a loop turn later."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def enforce_as_vllm(mp: pytest.MonkeyPatch) -> None:
    """In-process engines report the grammar kinds vLLM enforces (no Lark) while ``mp`` holds."""
    info = AsyncEngine.info
    assert isinstance(info, property) and info.fget is not None
    getter = info.fget
    as_vllm = property(lambda self: dataclasses.replace(getter(self), grammars=VLLM_GRAMMARS))
    mp.setattr(AsyncEngine, "info", as_vllm)


def slow_engine_steps(gw: LiveGateway, monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Make each step of ``gw``'s in-process engine at least ``seconds`` long, so that a long
    answer outlasts a deadline however fast this machine decodes the demo model (1500 tokens
    took about 1 s unslowed)."""
    engine = gw.state.engine
    assert isinstance(engine, AsyncEngine)
    step = engine._core.step
    monkeypatch.setattr(engine._core, "step", lambda: (time.sleep(seconds), step())[1])


async def create_database(template: str | None = None) -> str:
    """A new empty database, or a copy of ``template`` (fast: no migrations to run)."""
    name = f"kvgate_gw_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(PG_ADMIN_DSN)
    try:
        suffix = f' TEMPLATE "{template}"' if template else ""
        await conn.execute(f'CREATE DATABASE "{name}"{suffix}')
    finally:
        await conn.close()
    return name


async def drop_database(name: str) -> None:
    conn = await asyncpg.connect(PG_ADMIN_DSN)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def pg_url(name: str) -> str:
    return f"postgresql+asyncpg://postgres@127.0.0.1:5432/{name}"


def make_settings(database_url: str, tmp_path: Path, **env: str) -> Settings:
    base = {
        "KVGATE_DATABASE_URL": database_url,
        "KVGATE_ADMIN_TOKEN": ADMIN_TOKEN,
        "KVGATE_SECRETS_KEY": SECRETS_KEY,
        "KVGATE_VAR_DIR": str(tmp_path / "var"),
        "KVGATE_DEVICE": "cpu",
        # the float32 path these tests hold numbers to (auto is bfloat16 on a CPU with bf16 units)
        "KVGATE_DTYPE": "float32",
        "KVGATE_KV_CACHE_BYTES": str(KV_CACHE_BYTES),
        "KVGATE_DEFAULT_MAX_TOKENS": "8",
        "KVGATE_LOG_JSON": "true",
        # Tests drive many admin writes and wrong tokens through one principal and address; the
        # throttles themselves are tests/gateway/admin/test_admin_throttle.py's.
        "KVGATE_ADMIN_WRITES_PER_MINUTE": "1000000",
        "KVGATE_ADMIN_SIGN_IN_FAILURES_PER_MINUTE": "1000000",
    }
    return Settings.from_env({**base, **env})


@dataclass(frozen=True)
class TenantHandle:
    id: str
    key: str


class LiveGateway:
    def __init__(
        self,
        app: web.Application,
        runner: GatewayRunner,
        base_url: str,
        spans: InMemorySpanExporter,
        metrics_url: str = "",
    ) -> None:
        self.app = app
        self.runner = runner
        self._stopped = False
        self.base_url = base_url
        self.spans = spans
        self.metrics_url = metrics_url  # the metrics listener (never the public port)
        self.http = aiohttp.ClientSession()
        self._clients: list[AsyncOpenAI] = []
        self.contract_failures: list[str] = []

    @property
    def state(self) -> Any:
        return self.app[STATE]

    def openai(self, key: str, **kwargs: Any) -> AsyncOpenAI:
        """A client of this gateway; every answer it gets is checked against OpenAI's published
        schemas (tests/conformance/contract.py): leaving ``live_gateway`` fails on a violation."""
        contract = ContractTransport(self.contract_failures)
        client = contract_client(f"{self.base_url}/v1", key, contract, **kwargs)
        self._clients.append(client)
        return client

    async def admin(self, method: str, path: str, body: Any = None) -> Any:
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        url = f"{self.base_url}/admin/v1{path}"
        async with self.http.request(method, url, json=body, headers=headers) as resp:
            data = await resp.json()
            assert resp.status < 300, (resp.status, data)
            return data

    async def create_tenant(
        self,
        prefix: str,
        *,
        system_prompt: str | None = None,
        limits: Mapping[str, int] | None = None,
        allow_client_system: bool = True,
    ) -> TenantHandle:
        tenant_id = f"{prefix}-{uuid.uuid4().hex[:8]}"
        body: dict[str, Any] = {"id": tenant_id, "name": prefix}
        body["allow_client_system"] = allow_client_system
        if system_prompt is not None:
            body["system_prompt"] = system_prompt
        if limits is not None:
            body["limits"] = dict(limits)
        await self.admin("POST", "/tenants", body)
        key = await self.admin("POST", f"/tenants/{tenant_id}/keys", {"kind": "server"})
        return TenantHandle(tenant_id, key["key"])

    async def wait_pinned(self, tenant_id: str, timeout: float = 10.0) -> dict[str, Any]:
        """Wait until the tenant's current prompt is pinned (or refused) by the pin manager."""
        async with asyncio.timeout(timeout):
            while True:
                info = await self.admin("GET", f"/tenants/{tenant_id}/cache")
                if info["pin_state"] in ("pinned", "rejected", "no_prompt"):
                    return info
                await asyncio.sleep(0.02)

    async def shutdown(self) -> None:
        """Graceful shutdown, as on SIGTERM: stop listening, drain, clean up (once)."""
        if not self._stopped:
            self._stopped = True
            await self.runner.cleanup()

    async def close(self) -> None:
        for client in self._clients:
            await client.close()
        await self.http.close()

    def check_contract(self) -> None:
        failures, self.contract_failures[:] = list(self.contract_failures), []
        assert not failures, "answers outside OpenAI's schemas:\n" + "\n".join(failures[:20])


@contextlib.asynccontextmanager
async def live_gateway(
    settings: Settings, model_dir: Path, *, shutdown_timeout: float = 2.0
) -> AsyncIterator[LiveGateway]:
    spans = InMemorySpanExporter()
    app = create_app(settings, model_dir=str(model_dir), span_exporter=spans)
    metrics = MetricsListener("127.0.0.1", 0)  # as `kvgate serve` does, on a free port
    app.cleanup_ctx.append(metrics_listener(metrics, app[TELEMETRY].metrics.render))
    # The production HTTP layer (gateway/http.py): read deadlines (KVGATE_HEADER_TIMEOUT_S /
    # KVGATE_BODY_TIMEOUT_S of ``settings``), quote-free low-level errors, log redaction; the
    # access log stays on (tests may read it; it is redacted like every aiohttp line).
    runner = make_runner(
        app,
        settings.server.header_timeout_s,
        settings.server.body_timeout_s,
        handler_cancellation=True,
        shutdown_timeout=shutdown_timeout,
    )
    await runner.setup()
    await runner.listen_tcp("127.0.0.1", 0)
    host, port = runner.addresses[0][:2]
    gw = LiveGateway(app, runner, f"http://{host}:{port}", spans, metrics.url)
    try:
        await app[STATE].pins.ready.wait()
        yield gw
    finally:
        try:
            await gw.close()
        finally:
            await gw.shutdown()
    gw.check_contract()


@contextlib.asynccontextmanager
async def gateway_on_fresh_database(
    template: str, model_dir: Path, var_dir: Path
) -> AsyncIterator[LiveGateway]:
    """A live gateway on its own copy of the migrated template database, dropped afterwards."""
    name = await create_database(template)
    try:
        async with live_gateway(make_settings(pg_url(name), var_dir), model_dir) as live:
            yield live
    finally:
        await drop_database(name)
