"""Test-wide helpers.

A test that needs PostgreSQL or Redis and cannot reach it calls :func:`service_unavailable`: a
skip on a developer machine, a failure in CI (``CI=true``), so a run without its services can
never go green there.
"""

from __future__ import annotations

import os
import secrets
from typing import NoReturn

import pytest
import redis.asyncio as aioredis

SHARED_REDIS_URL = "redis://127.0.0.1:6379/0"  # the machine's Redis: own key prefixes only


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def service_unavailable(service: str, exc: BaseException) -> NoReturn:
    """Skip the test (fail it when ``CI=true``): ``service`` is not reachable."""
    message = f"{service} not reachable: {type(exc).__name__}: {exc}"
    if in_ci():
        pytest.fail(f"{message} (CI=true: a missing service fails the run)", pytrace=False)
    pytest.skip(message)


@pytest.fixture
async def redis_channel() -> str:
    """A fresh tenant-event channel name on the machine's Redis (which must answer)."""
    client = aioredis.from_url(SHARED_REDIS_URL)
    try:
        await client.ping()
    except OSError as exc:
        service_unavailable("Redis at 127.0.0.1:6379", exc)
    finally:
        await client.aclose()
    return f"kvgate-test-{secrets.token_hex(6)}:tenants"
