"""Spans (GenAI conventions), Prometheus metrics and log lines of a chat request."""

from __future__ import annotations

import asyncio
from pathlib import Path

import prometheus_client
import structlog
from aiohttp import web
from opentelemetry import trace

from gateway.context import SETTINGS
from gateway.settings import TelemetrySettings
from gateway.telemetry import GatewayMetrics, make_tracer_provider
from tests.gateway.harness import live_gateway, make_settings
from tests.loopback import serve_on_loopback

SYSTEM = "You are a careful assistant for the Telemetry team. Keep answers short. " * 3
SECRET_QUESTION = "my-private-question-text"


async def test_span_metrics_and_log_of_a_request(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    async with live_gateway(make_settings(gateway_database, tmp_path), demo_model_dir) as gw:
        t = await gw.create_tenant("tele", system_prompt=SYSTEM)
        await gw.wait_pinned(t.id)
        # The caller's W3C trace context: the server span joins that trace.
        parent_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
        traceparent = f"00-{parent_trace}-00f067aa0ba902b7-01"
        client = gw.openai(t.key, default_headers={"traceparent": traceparent})
        with structlog.testing.capture_logs() as logs:
            resp = await client.chat.completions.create(
                model=gw.state.model_name,
                messages=[{"role": "user", "content": SECRET_QUESTION}],
                max_tokens=4,
                temperature=0,
            )
            # The response is sent before the handler's bookkeeping ends: wait for the span.
            model = gw.state.model_name
            for _ in range(200):
                if any(s.name == f"chat {model}" for s in gw.spans.get_finished_spans()):
                    break
                await asyncio.sleep(0.01)
        spans = gw.spans.get_finished_spans()
        (root,) = [s for s in spans if s.name == f"chat {model}"]
        a = root.attributes
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.provider.name"] == "kvgate"
        assert a["gen_ai.request.model"] == model
        assert a["gen_ai.request.max_tokens"] == 4
        assert a["gen_ai.request.temperature"] == 0
        assert a["gen_ai.usage.input_tokens"] == resp.usage.prompt_tokens
        assert a["gen_ai.usage.output_tokens"] == resp.usage.completion_tokens
        cached = resp.usage.prompt_tokens_details.cached_tokens
        assert a["gen_ai.usage.cache_read.input_tokens"] == cached > 0
        assert tuple(a["gen_ai.response.finish_reasons"]) == ("length",)
        assert root.kind == trace.SpanKind.SERVER
        assert format(root.context.trace_id, "032x") == parent_trace
        assert root.parent is not None and root.parent.span_id == 0x00F067AA0BA902B7
        children = {
            s.name: s for s in spans if s.parent and s.parent.span_id == root.context.span_id
        }
        assert set(children) == {
            "gen_ai.rate_limit",
            "gen_ai.queue",
            "gen_ai.prefill",
            "gen_ai.decode",
        }
        for child in children.values():
            assert root.start_time <= child.start_time <= child.end_time <= root.end_time + 10**6
        assert children["gen_ai.prefill"].end_time <= children["gen_ai.decode"].end_time

        (line,) = [e for e in logs if e["event"] == "chat_request"]
        assert line["tenant"] == t.id and line["status"] == 200
        assert line["trace_id"] == format(root.context.trace_id, "032x")
        assert line["request_id"] == resp.id
        assert line["cached_tokens"] == cached and line["ttft_ms"] > 0
        flat = repr(logs)
        assert SECRET_QUESTION not in flat and t.key not in flat and SYSTEM[:30] not in flat

        text = await (await gw.http.get(gw.metrics_url)).text()
        assert f'kvgate_requests_total{{status="200",tenant="{t.id}"}} 1.0' in text
        assert f'kvgate_ttft_seconds_count{{tenant="{t.id}"}} 1.0' in text
        assert f'kvgate_time_per_output_token_seconds_count{{tenant="{t.id}"}} 1.0' in text
        assert f'kvgate_prefix_cache_hit_tokens_total{{tenant="{t.id}"}} {float(cached)}' in text
        assert f'kvgate_prefix_cache_query_tokens_total{{tenant="{t.id}"}}' in text
        for state in ("total", "free", "pinned"):
            assert f'kvgate_kv_blocks{{state="{state}"}}' in text
        assert "kvgate_ratelimit_rejections" in text
        async with gw.http.post(f"{gw.base_url}/v1/chat/completions", json={}) as r:
            assert r.status == 401
        text = await (await gw.http.get(gw.metrics_url)).text()
        assert 'kvgate_requests_total{status="401",tenant=""} 1.0' in text
        too_big = b"x" * (gw.app[SETTINGS].server.max_body_bytes + 1)
        headers = {"Authorization": f"Bearer {t.key}"}
        url = f"{gw.base_url}/v1/chat/completions"
        async with gw.http.post(url, data=too_big, headers=headers) as r:
            assert r.status == 413
        text = await (await gw.http.get(gw.metrics_url)).text()
        assert f'kvgate_requests_total{{status="413",tenant="{t.id}"}} 1.0' in text


def test_registries_and_tracer_providers_are_per_app() -> None:
    a, b = GatewayMetrics(), GatewayMetrics()  # no duplicate-registration error
    a.requests.labels("t", "200").inc()
    assert b'kvgate_requests_total{status="200",tenant="t"} 1.0' in a.render()
    assert b'tenant="t"' not in b.render()
    assert prometheus_client.REGISTRY.get_sample_value("kvgate_requests_total") is None
    make_tracer_provider(TelemetrySettings("info", True, "svc", None))
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


async def test_otlp_export_when_endpoint_is_set() -> None:
    received: list[bytes] = []

    async def collect(request: web.Request) -> web.Response:
        received.append(await request.read())
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/v1/traces", collect)
    async with serve_on_loopback(app) as (host, port):
        endpoint = f"http://{host}:{port}"
        provider = make_tracer_provider(TelemetrySettings("info", True, "svc", endpoint))
        with provider.get_tracer("t").start_as_current_span("chat demo"):
            pass
        await asyncio.to_thread(provider.force_flush)
        await asyncio.to_thread(provider.shutdown)
    assert received and b"chat demo" in received[0]
