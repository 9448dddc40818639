from __future__ import annotations

from tests.tenants.fixtures import db_url, postgresql_url, sqlite_url, store

__all__ = ["db_url", "postgresql_url", "sqlite_url", "store"]
