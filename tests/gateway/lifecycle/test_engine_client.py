"""The gateway calls every engine through ``EngineClient`` (engine/api.py) and every limiter
through ``Limiter``: no call site asks which implementation it holds."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Sequence

import pytest
from prometheus_client import generate_latest

from engine.api import EngineClient, PinStatus, PinTicket
from gateway.prompts.pins import PINNED, PinManager
from gateway.ratelimit.memory import MemoryLimiter
from gateway.ratelimit.types import SharedState
from gateway.telemetry import GatewayMetrics
from tenants.runtime import TenantRuntime
from tenants.settings import DEFAULT_LIMITS
from tests.fake_engine import FakeEngine
from tests.gateway.prompts.test_pins import CountingTokenizer

ENGINES = [
    "engine.serving.async_engine.AsyncEngine",
    "gateway.cluster.engine.ClusterEngine",
    "tests.fake_engine.FakeEngine",
]


@pytest.mark.parametrize("path", ENGINES)
def test_engines_implement_every_call_of_the_protocol(path: str) -> None:
    module, _, name = path.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    members = {n for n in vars(EngineClient) if not n.startswith("_")}
    assert {"generate", "pin", "unpin", "pin_status", "info"} <= members
    for member in members:
        proto = getattr(EngineClient, member)
        impl = getattr(cls, member, None)
        assert impl is not None and impl is not proto, (path, member)
        if inspect.isfunction(proto):  # the protocol's parameters, by name and in order
            want = list(inspect.signature(proto).parameters)
            assert list(inspect.signature(impl).parameters)[: len(want)] == want, (path, member)


class _Ticket:
    def __init__(self, owner: str, namespace: str) -> None:
        self.owner, self.namespace = owner, namespace


class _HeldOnWorkers(FakeEngine):
    """Pins like a cluster: its status names the workers holding the pin."""

    def __init__(self) -> None:
        self.pins: list[tuple[str, str]] = []

    async def pin(self, owner: str, namespace: str, token_ids: Sequence[int]) -> PinTicket:
        self.pins.append((owner, namespace))
        return _Ticket(owner, namespace)

    def pin_status(self, ticket: PinTicket | None) -> PinStatus:
        if ticket is None:
            return PinStatus(0, 0, None, {})
        return PinStatus(2, 32, "mixed", {"w1": "host", "w0": "device"})


async def test_the_pin_manager_pins_for_the_tenant_and_reports_the_engine_status() -> None:
    engine = _HeldOnWorkers()
    pins = PinManager(engine, CountingTokenizer(), store=None)  # type: ignore[arg-type]
    rt = TenantRuntime("t1", "active", "salt-1", 1, "Be brief.", DEFAULT_LIMITS, True)
    entry = await pins.activate(rt)
    assert entry.state == PINNED and engine.pins == [("t1", "salt-1")]
    info = pins.cache_info("t1")
    assert (info["pinned_blocks"], info["pinned_tokens"], info["pin_tier"]) == (2, 32, "mixed")
    assert info["pinned_on"] == ["w0", "w1"]
    assert info["pin_tiers"] == {"w1": "host", "w0": "device"}
    unknown = pins.cache_info("nobody")  # no pin held: a cluster reports no holders
    assert unknown["pinned_on"] == [] and unknown["pin_tiers"] == {}
    await pins.close()


class _SharedLimiter(MemoryLimiter):
    """A limiter that says it shares state and that the shared store is away."""

    def shared_state(self) -> SharedState:
        return SharedState(down=True, fail_open=True, failovers=3, fallback_decisions=7)


def test_limiter_metrics_come_from_its_shared_state() -> None:
    metrics = GatewayMetrics()
    metrics.watch(None, _SharedLimiter())
    text = generate_latest(metrics.registry).decode()
    assert "kvgate_ratelimit_redis_down 1.0" in text
    assert "kvgate_ratelimit_failovers_total 3.0" in text
    assert "kvgate_ratelimit_fallback_decisions_total 7.0" in text
    metrics.watch(None, MemoryLimiter())  # nothing shared: no fail-over series
    assert "kvgate_ratelimit_redis_down" not in generate_latest(metrics.registry).decode()
