"""Engine queue refusals as HTTP: this tenant's share full is a 429, the engine full a 503."""

from __future__ import annotations

from engine.errors import EngineOverloaded, TenantQueueFull
from gateway.app import register_gateway_errors
from gateway.errors import to_api_error


def test_a_tenant_over_its_queue_share_gets_429_and_the_full_engine_503() -> None:
    register_gateway_errors()
    share = to_api_error(TenantQueueFull("this tenant holds its share"))
    full = to_api_error(EngineOverloaded("engine queue is full"))
    assert share is not None and full is not None
    assert (share.status, share.code, share.type) == (429, "tenant_queue_full", "rate_limit_error")
    assert (full.status, full.code) == (503, "engine_overloaded")
    assert share.headers == {"Retry-After": "1"} and full.headers == {"Retry-After": "1"}
    share.headers["x"] = "y"  # each answer has its own headers
    assert to_api_error(TenantQueueFull("again")).headers == {"Retry-After": "1"}  # type: ignore[union-attr]
