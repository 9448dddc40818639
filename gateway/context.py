"""Typed application keys: what ``create_app`` puts on the app and views read.

Resources (database, limiter, engine, pins) are opened and closed by ``cleanup_ctx`` in
gateway/app.py; ``GatewayState`` holds the ones that exist only while the app runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Tracer

from engine.api import EngineClient
from engine.text.tokenizer import Tokenizer
from gateway.access.auth import KeyCache
from gateway.lifecycle.drain import Drain
from gateway.prompts.pins import PinManager
from gateway.prompts.tenant_prefix import VersionEncoder
from gateway.prompts.tokenize_pool import TokenizePool
from gateway.ratelimit import Limiter
from gateway.settings import Settings
from gateway.telemetry import GatewayMetrics
from tenants.store import TenantStore


@dataclass
class GatewayState:
    store: TenantStore
    limiter: Limiter
    engine: EngineClient  # in this process (AsyncEngine) or in workers (ClusterEngine)
    tokenizer: Tokenizer
    model_name: str
    keys: KeyCache
    pins: PinManager
    # A prompt version's encoded tenant prefix (text and tools): the pin manager's builds and
    # the admin API's token counts (gateway/chat/tools/tenant.py's VersionPrefixes).
    encode_version: VersionEncoder
    draining: bool = False  # set at shutdown: /readyz answers 503, new requests are refused
    drain: Drain = field(default_factory=Drain)  # chat requests in flight, cut at the deadline
    prompts: TokenizePool = field(default_factory=TokenizePool)  # large prompts off the loop


@dataclass(frozen=True)
class Telemetry:
    metrics: GatewayMetrics
    provider: TracerProvider
    tracer: Tracer


SETTINGS = web.AppKey("settings", Settings)
TELEMETRY = web.AppKey("telemetry", Telemetry)
STATE = web.AppKey("state", GatewayState)
