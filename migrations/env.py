"""Alembic environment (async). Two entry modes:

- ``tenants.migrate`` (``kvgate migrate``, tests, embedded start-up) passes an open sync
  connection in ``config.attributes["connection"]``; migrations run on it.
- The ``alembic`` command line (``alembic -c alembic.ini upgrade head``) gets no connection;
  one is opened from ``KVGATE_DATABASE_URL`` or ``sqlalchemy.url`` with an async engine.
"""

from __future__ import annotations

import asyncio
import os

from alembic import context
from sqlalchemy.engine import Connection

# Explicit model import: the metadata below must know every table.
from tenants import conversation_models, models, usage_models  # noqa: F401 (their tables)
from tenants.db import make_engine
from tenants.settings import DEFAULT_DATABASE_URL

target_metadata = models.Base.metadata
config = context.config


def _do_run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_async(url: str) -> None:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            await conn.run_sync(_do_run)
            await conn.commit()
    finally:
        await engine.dispose()


def _run_offline(url: str) -> None:
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def _main() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _do_run(connection)
        return
    # The alembic command line is an operator entry point: reading the environment is expected.
    url = (
        os.environ.get("KVGATE_DATABASE_URL")
        or config.get_main_option("sqlalchemy.url")
        or DEFAULT_DATABASE_URL
    )
    if context.is_offline_mode():
        _run_offline(url)
    else:
        asyncio.run(_run_async(url))


_main()
