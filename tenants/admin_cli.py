"""``kvgate tenants create-admin | list-admins | show-admin | revoke-admin``: admin principals.

Registered on the ``kvgate tenants`` parser by tenants/cli.py; same database, audit actor
("cli") and Redis announcement (a revoked token is refused by running gateways at once).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable
from typing import Any

from tenants.admin_schemas import AdminCreate, AdminOut
from tenants.admins import AdminStore
from tenants.schemas import parse
from tenants.store import TenantStore

ACTOR = "cli"
Action = Callable[[TenantStore, argparse.Namespace], Awaitable[None]]


def add_admin_commands(sub: Any) -> None:
    p = sub.add_parser("create-admin", help="create an admin token (printed once)")
    p.add_argument("--scope", required=True, help='"platform" or a tenant id')
    p.add_argument("--access", required=True, choices=("editor", "viewer"))
    p.add_argument("--name", help="who or what holds the token")
    p.add_argument("--expires-at", help="ISO 8601 time the token stops working (UTC if no offset)")
    p = sub.add_parser("list-admins", help="list admin principals (never their tokens)")
    p.add_argument("--scope", help='only "platform" or only this tenant\'s admins')
    p = sub.add_parser("show-admin", help="show one admin principal")
    p.add_argument("admin_id")
    p = sub.add_parser("revoke-admin", help="revoke an admin token (refused at once)")
    p.add_argument("admin_id")


def _row(a: AdminOut) -> str:
    expires = a.expires_at.isoformat(timespec="seconds") if a.expires_at else "-"
    return f"{a.id:<22} {a.scope:<24} {a.access:<7} {a.status:<8} {expires:<26} {a.name or ''}"


async def _create(store: TenantStore, args: argparse.Namespace) -> None:
    body: dict[str, Any] = {"scope": args.scope, "access": args.access}
    if args.name:
        body["name"] = args.name
    if args.expires_at:
        body["expires_at"] = args.expires_at
    created = await AdminStore(store).create(parse(AdminCreate, body), actor=ACTOR)
    print(f"admin id: {created.id}\ntoken:    {created.token}\n(the token is shown only this once)")


async def _list(store: TenantStore, args: argparse.Namespace) -> None:
    print(f"{'ID':<22} {'SCOPE':<24} {'ACCESS':<7} {'STATUS':<8} {'EXPIRES':<26} NAME")
    for admin in await AdminStore(store).list_all(args.scope):
        print(_row(admin))


async def _show(store: TenantStore, args: argparse.Namespace) -> None:
    admin = await AdminStore(store).get(args.admin_id)
    print(json.dumps(admin.model_dump(mode="json"), indent=2, sort_keys=True))


async def _revoke(store: TenantStore, args: argparse.Namespace) -> None:
    admin = await AdminStore(store).revoke(args.admin_id, actor=ACTOR)
    print(f"admin {admin.id} is {admin.status}")


ADMIN_ACTIONS: dict[str, Action] = {
    "create-admin": _create,
    "list-admins": _list,
    "show-admin": _show,
    "revoke-admin": _revoke,
}
