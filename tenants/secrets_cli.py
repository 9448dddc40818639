"""``kvgate secrets ...``: the installation's secrets key and the secrets sealed under it.

    kvgate secrets status    fingerprints of the given keys and of the keys the database's
                             secrets are sealed under; exit 0 when a gateway would start with
                             these keys, 2 when not
    kvgate secrets rotate    reseal every stored secret under the first key of
                             KVGATE_SECRETS_KEY (one transaction) and forget the other keys

The key is KVGATE_SECRETS_KEY (or, with the embedded SQLite file, <KVGATE_VAR_DIR>/secrets.key);
the database ``--database-url`` or KVGATE_DATABASE_URL. The rotation procedure is in
docs/operations.md. Exit codes: 0 ok, 1 store error (a secret no key opens included), 2 usage
or configuration error (a key missing or not the database's).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from tenants.cli import reported, settings_from_env
from tenants.models import SecretKey
from tenants.secret_keys import load_box
from tenants.secret_store import keys_missing, reseal_all
from tenants.settings import TenantStoreSettings
from tenants.store import TenantStore


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvgate secrets", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("status", "rotate"):
        s = sub.add_parser(name)
        s.add_argument("--database-url", help="database URL (default: KVGATE_DATABASE_URL)")
    return p


async def _listed(session: AsyncSession) -> list[str]:
    found = await session.scalars(select(SecretKey.fingerprint).order_by(SecretKey.fingerprint))
    return list(found)


async def _run(cmd: str, settings: TenantStoreSettings) -> int:
    from tenants.migrate import check_schema

    store = TenantStore.open(settings.database_url)
    try:
        await check_schema(store.engine)
        box = await asyncio.to_thread(load_box, settings.secrets)
        print(f"keys given: {', '.join(box.fingerprints)} (the first seals)")
        if cmd == "rotate":
            done = await store.write(lambda s: reseal_all(s, box))
            print(
                f"resealed under {box.current}: {done.tool_secrets} tool secrets, "
                f"{done.bearers} MCP bearer tokens; {done.keys_dropped} old keys forgotten"
            )
            return 0
        listed = await store.read(_listed)
        print(f"database's keys: {', '.join(listed) or 'none yet (a first start claims it)'}")
        missing = await store.read(lambda s: keys_missing(s, box))
        if missing:
            print(f"missing: {', '.join(missing)}: a gateway would not start", file=sys.stderr)
            return 2
        print("a gateway starts with these keys")
        return 0
    finally:
        await store.aclose()


def main(argv: Sequence[str]) -> int:
    try:
        args = _parser().parse_args(list(argv[1:]))
    except SystemExit as exc:
        return int(exc.code or 0)

    def run() -> int:  # the settings read inside ``reported``: a bad value is one line
        return asyncio.run(_run(args.cmd, settings_from_env(args.database_url)))

    return reported("secrets", run)
