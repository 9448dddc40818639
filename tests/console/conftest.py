"""Fixtures of the console tests: one gateway and one Chromium per module."""

from __future__ import annotations

from tests.gateway.conftest import (  # noqa: F401  (shared fixtures)
    demo_model_dir,
    gateway_database,
    template_database,
)
