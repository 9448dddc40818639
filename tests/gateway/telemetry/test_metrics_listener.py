"""/metrics lives on its own listener: `kvgate serve` binds KVGATE_METRICS_HOST:PORT, the public
port answers 404; /readyz names its checks for what they mean."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from gateway.settings import Settings, SettingsError
from gateway.telemetry import GatewayMetrics, MetricsListener
from tests.e2e.servers import ServeProcess
from tests.gateway.harness import live_gateway, make_settings
from tests.gateway.redis_server import free_port


def test_settings() -> None:
    default = Settings.from_env({}).server
    assert (default.metrics_host, default.metrics_port) == ("127.0.0.1", 9464)
    custom = Settings.from_env({"KVGATE_METRICS_HOST": "0.0.0.0", "KVGATE_METRICS_PORT": "0"})
    assert (custom.server.metrics_host, custom.server.metrics_port) == ("0.0.0.0", 0)
    with pytest.raises(SettingsError, match="KVGATE_METRICS_PORT"):
        Settings.from_env({"KVGATE_METRICS_PORT": "70000"})


async def test_listener_serves_the_registry_and_closes() -> None:
    metrics = GatewayMetrics()
    metrics.tenant("acme").count_request(200)
    listener = MetricsListener("127.0.0.1", 0)
    await listener.start(metrics.render)
    url = listener.url
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(url) as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                assert 'kvgate_requests_total{status="200",tenant="acme"} 1.0' in await resp.text()
            async with http.get(url.replace("/metrics", "/healthz")) as resp:
                assert resp.status == 404
    finally:
        await listener.close()
    assert listener.address is None
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ClientConnectionError):
            await http.get(url)


async def test_public_port_has_no_metrics_and_readyz_says_accepting(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    async with live_gateway(make_settings(gateway_database, tmp_path), demo_model_dir) as gw:
        async with gw.http.get(f"{gw.base_url}/metrics") as resp:
            assert resp.status == 404
            assert (await resp.json())["error"]["type"] == "not_found_error"
        async with gw.http.get(gw.metrics_url) as resp:
            assert resp.status == 200 and "kvgate_kv_blocks" in await resp.text()
        async with gw.http.get(f"{gw.base_url}/readyz") as resp:
            body = await resp.json()
            assert resp.status == 200 and body["ready"] is True
            assert body["checks"]["accepting"] is True and "draining" not in body["checks"]
        gw.state.draining = True
        async with gw.http.get(f"{gw.base_url}/readyz") as resp:
            body = await resp.json()
            assert resp.status == 503 and body["checks"]["accepting"] is False
        gw.state.draining = False


async def test_kvgate_serve_binds_the_metrics_port(tmp_path: Path) -> None:
    metrics_port = free_port()
    proc = ServeProcess(tmp_path, {"KVGATE_METRICS_PORT": str(metrics_port)})
    proc.start()
    try:
        await proc.wait_ready()
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{proc.url}/metrics") as resp:
                assert resp.status == 404
            async with http.get(f"http://127.0.0.1:{metrics_port}/metrics") as resp:
                assert resp.status == 200 and "kvgate_kv_blocks" in await resp.text()
    finally:
        assert await proc.stop() == 0
    assert f"metrics on 127.0.0.1:{metrics_port}" in proc.read_output()
