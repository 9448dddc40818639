"""Test-wide helpers.

A test that needs PostgreSQL or Redis and cannot reach it calls :func:`service_unavailable`: a
skip on a developer machine, a failure in CI (``CI=true``), so a run without its services can
never go green there.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def service_unavailable(service: str, exc: BaseException) -> NoReturn:
    """Skip the test (fail it when ``CI=true``): ``service`` is not reachable."""
    message = f"{service} not reachable: {type(exc).__name__}: {exc}"
    if in_ci():
        pytest.fail(f"{message} (CI=true: a missing service fails the run)", pytrace=False)
    pytest.skip(message)
