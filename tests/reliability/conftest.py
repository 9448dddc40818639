"""Fixtures of the reliability suite: the gateway tests' database and model fixtures.

Each test gets a fresh PostgreSQL database (a copy of one migrated template) and builds its own
faults: a TCP proxy in front of PostgreSQL (``_proxy.py``), a private redis-server.
"""

from __future__ import annotations

from tests.gateway.conftest import (
    demo_model_dir,
    gateway_database,
    private_redis,
    redis_prefix,
    shared_redis,
    template_database,
)

__all__ = [
    "demo_model_dir",
    "gateway_database",
    "private_redis",
    "redis_prefix",
    "shared_redis",
    "template_database",
]
