"""Alembic environment of the tenant store (a package so its location resolves from any cwd)."""
