"""``kvgate migrate`` and ``kvgate tenants ...``: operator commands on the database directly.

``main(argv)`` gets argv[0] = the command name ("migrate" or "tenants"). The database is
``--database-url`` or KVGATE_DATABASE_URL (default: the embedded SQLite file). Mutations write
audit rows with actor "cli" and, when KVGATE_REDIS_URL is set, announce the change to running
gateways over Redis. Exit codes: 0 ok, 1 store error, 2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tenants.errors import ConfigError, TenantStoreError
from tenants.events import EventBus, RedisEventBridge
from tenants.schemas import KeyCreate, LimitsIn, TenantCreate, parse
from tenants.settings import TenantStoreSettings
from tenants.store import TenantStore

ACTOR = "cli"
LIMIT_OPTS = ("rpm", "tpm", "max_concurrency", "max_output_tokens")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--database-url", help="database URL (default: KVGATE_DATABASE_URL)")


def _add_limits(p: argparse.ArgumentParser) -> None:
    for name in LIMIT_OPTS:
        p.add_argument(f"--{name.replace('_', '-')}", type=int, dest=name, metavar="N")


def _add_prompt(p: argparse.ArgumentParser, required: bool) -> None:
    g = p.add_mutually_exclusive_group(required=required)
    g.add_argument("--prompt", "--text", dest="prompt", help="system prompt text")
    g.add_argument("--prompt-file", "--file", dest="prompt_file", help="file with it ('-': stdin)")


def build_parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="kvgate tenants", description="manage tenants")
    sub = root.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = sub.add_parser("create", help="create a tenant")
    p.add_argument("id")
    p.add_argument("--name", required=True)
    p.add_argument("--no-client-system", action="store_true", help="drop client system messages")
    _add_prompt(p, required=False)
    _add_limits(p)
    p = sub.add_parser("list", help="list tenants")
    p.add_argument("--status", help="active, suspended, deleted or all (default: not deleted)")
    p = sub.add_parser("show", help="show one tenant with its keys")
    p.add_argument("id")
    p = sub.add_parser("set-prompt", help="set the system prompt (new version)")
    p.add_argument("id")
    _add_prompt(p, required=True)
    p = sub.add_parser("create-key", help="create an API key (printed once)")
    p.add_argument("id")
    p.add_argument("--kind", choices=("server", "widget"), required=True)
    p.add_argument("--origin", action="append", default=[], dest="origins", help="widget origin")
    p = sub.add_parser("revoke-key", help="revoke an API key")
    p.add_argument("id")
    p.add_argument("key_id")
    p = sub.add_parser("set-limits", help="replace the limits (omitted: default from settings)")
    p.add_argument("id")
    _add_limits(p)
    for action in sub.choices.values():
        _common(action)
    return root


def _prompt_text(args: argparse.Namespace) -> str | None:
    if args.prompt_file is None:
        return args.prompt
    if args.prompt_file == "-":
        return sys.stdin.read()
    return Path(args.prompt_file).read_text(encoding="utf-8")


def _limits(args: argparse.Namespace) -> dict[str, Any]:
    return {name: getattr(args, name) for name in LIMIT_OPTS}


def _print(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True))


async def _run_action(store: TenantStore, args: argparse.Namespace) -> None:
    a = args.action
    if a == "create":
        data = parse(
            TenantCreate,
            {
                "id": args.id,
                "name": args.name,
                "system_prompt": _prompt_text(args),
                "limits": _limits(args),
                "allow_client_system": not args.no_client_system,
            },
        )
        _print((await store.create_tenant(data, actor=ACTOR)).model_dump(mode="json"))
    elif a == "list":
        await _list(store, args.status)
    elif a == "show":
        _print((await store.get_tenant(args.id)).model_dump(mode="json"))
    elif a == "set-prompt":
        version = await store.set_system_prompt(args.id, _prompt_text(args) or "", actor=ACTOR)
        print(f"tenant {args.id}: system prompt version {version} is active")
    elif a == "create-key":
        data = parse(KeyCreate, {"kind": args.kind, "allowed_origins": args.origins})
        created = await store.create_key(args.id, data, actor=ACTOR)
        print(f"key id: {created.id}\nkey:    {created.key}\n(the key is shown only this once)")
    elif a == "revoke-key":
        key = await store.revoke_key(args.id, args.key_id, actor=ACTOR)
        print(f"key {key.id} revoked at {key.revoked_at.isoformat() if key.revoked_at else '?'}")
    elif a == "set-limits":
        tenant = await store.set_limits(args.id, parse(LimitsIn, _limits(args)), actor=ACTOR)
        _print(tenant.limits.model_dump(mode="json"))


async def _list(store: TenantStore, status: str | None) -> None:
    cursor: str | None = None
    print(f"{'ID':<24} {'STATUS':<10} {'PROMPT':>6}  NAME")
    while True:
        page = await store.list_tenants(limit=200, cursor=cursor, status=status)
        for t in page.data:
            version = "-" if t.prompt_version is None else str(t.prompt_version)
            print(f"{t.id:<24} {t.status:<10} {version:>6}  {t.name}")
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


async def _tenants(settings: TenantStoreSettings, args: argparse.Namespace) -> None:
    from tenants.migrate import check_schema

    bus = EventBus()
    bridge = None
    if settings.redis_url:
        bridge = RedisEventBridge.from_url(bus, settings.redis_url, settings.event_channel)
        bus.add_forwarder(bridge.send)
    store = TenantStore.open(settings.database_url, bus=bus, default_limits=settings.default_limits)
    try:
        await check_schema(store.engine)
        await _run_action(store, args)
    finally:
        await store.aclose()
        if bridge is not None:
            await bridge.aclose()


def _settings(database_url: str | None) -> TenantStoreSettings:
    env = dict(os.environ)
    if database_url:
        env["KVGATE_DATABASE_URL"] = database_url
    return TenantStoreSettings.from_env(env)


def main(argv: Sequence[str]) -> int:
    command, rest = argv[0], list(argv[1:])
    try:
        if command == "migrate":
            p = argparse.ArgumentParser(prog="kvgate migrate", description="upgrade schema to head")
            _common(p)
            args = p.parse_args(rest)
            settings = _settings(args.database_url)
            from tenants.migrate import upgrade_to_head

            asyncio.run(upgrade_to_head(settings.database_url))
            print("tenant database schema is at head")
            return 0
        args = build_parser().parse_args(rest)
        asyncio.run(_tenants(_settings(args.database_url), args))
        return 0
    except ConfigError as exc:
        print(f"kvgate {command}: configuration error: {exc}", file=sys.stderr)
        return 2
    except (TenantStoreError, OSError) as exc:
        print(f"kvgate {command}: error: {exc}", file=sys.stderr)
        return 1
