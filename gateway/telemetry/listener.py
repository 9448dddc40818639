"""The Prometheus scrape endpoint on a listener of its own, never on the public port.

The series are labelled by tenant id, so whoever reads ``/metrics`` can list the tenants and
their traffic: the endpoint belongs to the operator's network, not to API clients. ``kvgate
serve`` binds it to ``KVGATE_METRICS_HOST:KVGATE_METRICS_PORT`` (default 127.0.0.1:9464; port 0:
no listener); the public port answers ``/metrics`` with 404 like any unknown path. It is served on
the same HTTP layer as the API (gateway/http: read deadlines, quote-free refusals).

    render = app[TELEMETRY].metrics.render
    app.cleanup_ctx.append(metrics_listener(listener, render))  # opened and closed with the app
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from aiohttp import web

from gateway.http import GatewayRunner, make_runner
from gateway.telemetry.metrics import CONTENT_TYPE

Render = Callable[[], bytes]
HEADER_S, BODY_S = 10.0, 10.0  # a scrape is a small GET


class MetricsListener:
    """``GET /metrics`` on ``host:port`` (port 0: a free port, read back from ``address``)."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._runner: GatewayRunner | None = None
        self.address: tuple[str, int] | None = None  # bound (host, port) while open

    async def start(self, render: Render) -> None:
        async def metrics(request: web.Request) -> web.Response:
            return web.Response(body=render(), headers={"Content-Type": CONTENT_TYPE})

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = make_runner(app, HEADER_S, BODY_S, access_log=None)
        await runner.setup()
        try:
            await runner.listen_tcp(self.host, self.port)
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        host, port = runner.addresses[0][:2]
        self.address = (host, port)

    @property
    def url(self) -> str:
        assert self.address is not None, "metrics listener not started"
        host, port = self.address
        return f"http://{host}:{port}/metrics"

    async def close(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            self.address = None
            await runner.cleanup()


def metrics_listener(
    listener: MetricsListener, render: Render
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A ``cleanup_ctx`` entry: ``render`` (the app's registry) served on ``listener``."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        await listener.start(render)
        try:
            yield
        finally:
            await listener.close()

    return ctx
