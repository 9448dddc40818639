"""The admin API: an aiohttp sub-app mounted at ``ADMIN_PREFIX`` by the gateway."""

from __future__ import annotations

from gateway.admin.app import ADMIN_PREFIX, create_admin_app
from gateway.admin.context import CacheProvider, PromptLimit

__all__ = ["ADMIN_PREFIX", "CacheProvider", "PromptLimit", "create_admin_app"]
