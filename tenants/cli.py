"""``kvgate migrate`` and ``kvgate tenants ...``: operator commands on the database directly.

Admin principals: ``create-admin``, ``list-admins``, ``show-admin``, ``revoke-admin``
(tenants/admin_cli.py).

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
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from tenants.admin_cli import ADMIN_ACTIONS, add_admin_commands
from tenants.carry import prepare_version
from tenants.conversation_admin import ConversationAdmin, end_user_owner, purged_body
from tenants.errors import ConfigError, TenantStoreError
from tenants.events import EventBus, RedisEventBridge
from tenants.schemas import KeyCreate, KeyLimitsIn, LimitsIn, TenantCreate, TenantPatch, parse
from tenants.settings import TenantStoreSettings
from tenants.store import TenantStore
from tenants.tool_service import ToolStore

ACTOR = "cli"
LIMIT_OPTS = ("rpm", "tpm", "max_concurrency", "max_output_tokens", "weight")
KEY_LIMIT_OPTS = ("rpm", "tpm", "max_concurrency")
LIMIT_HELP = {
    "weight": "fair share of the engine while tenants compete (default 1)",
    "rpm": "requests per minute",
    "tpm": "tokens per minute (prompt + completion)",
    "max_concurrency": "requests in flight at once",
    "max_output_tokens": "largest max_tokens a request may ask for",
}


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--database-url", help="database URL (default: KVGATE_DATABASE_URL)")


def _add_limits(p: argparse.ArgumentParser, names: Sequence[str] = LIMIT_OPTS) -> None:
    for name in names:
        flag = f"--{name.replace('_', '-')}"
        kind = float if name == "weight" else int
        p.add_argument(flag, type=kind, dest=name, metavar="N", help=LIMIT_HELP[name])


# set-policy's switches: flag -> (TenantPatch field, help); each takes on or off.
POLICY_SWITCHES = {
    "--client-system": (
        "allow_client_system",
        "off: chat requests that carry system or developer messages are refused (400)",
    ),
    "--conversation-store": (
        "conversation_store",
        "off: every response is served with store off (nothing kept)",
    ),
    "--vllm-visitor-salt": (
        "vllm_visitor_salt",
        "on: through vLLM (KVGATE_BACKEND=vllm), a cache salt per visitor: visitors isolated, "
        "the tenant prefix computed again for each (docs/contracts.md, 'Through vLLM')",
    ),
}


def _add_policy(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", help="the tenant's display name")
    for flag, (dest, help_) in POLICY_SWITCHES.items():
        p.add_argument(flag, dest=dest, choices=("on", "off"), help=help_)
    p.add_argument(
        "--conversation-retention-days",
        dest="conversation_retention_days",
        type=int,
        metavar="N",
        help="days a stored conversation is kept after its last turn (0: the gateway's "
        "KVGATE_CONVERSATION_RETENTION_DAYS)",
    )


def _add_prompt(p: argparse.ArgumentParser, required: bool) -> None:
    g = p.add_mutually_exclusive_group(required=required)
    g.add_argument("--prompt", "--text", dest="prompt", help="system prompt text")
    g.add_argument("--prompt-file", "--file", dest="prompt_file", help="file with it ('-': stdin)")


def _tenant_cmd(sub: Any, name: str, help_: str) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(name, help=help_, description=help_)
    p.add_argument("id", help="tenant id")
    return p


def _version_cmd(sub: Any, name: str, help_: str) -> argparse.ArgumentParser:
    p = _tenant_cmd(sub, name, help_)
    p.add_argument("version", type=int, help="prompt version (see prompt-versions)")
    return p


def build_parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="kvgate tenants", description="manage tenants")
    sub = root.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = _tenant_cmd(sub, "create", "create a tenant")
    p.add_argument("--name", required=True)
    p.add_argument(
        "--no-client-system",
        action="store_true",
        help="the server rejects (400) chat requests that carry system or developer messages",
    )
    _add_prompt(p, required=False)
    _add_limits(p)
    p = sub.add_parser("list", help="list tenants")
    p.add_argument("--status", help="active, suspended, deleted or all (default: not deleted)")
    _tenant_cmd(sub, "show", "show one tenant with its keys")
    _tenant_cmd(sub, "suspend", "suspend a tenant: its keys get 403 until it is resumed")
    _tenant_cmd(sub, "resume", "make a suspended or deleted tenant active again")
    _tenant_cmd(sub, "delete", "soft-delete a tenant: its keys stop authenticating (401)")
    p = _tenant_cmd(sub, "set-policy", "change a tenant's name and policies (as PATCH does)")
    _add_policy(p)
    p = _tenant_cmd(sub, "set-prompt", "set the system prompt (a new version, made active)")
    _add_prompt(p, required=True)
    p.add_argument(
        "--tools-file",
        help="JSON file: the version's tools (a list), or an object with tools, tool_choice "
        "and max_tool_rounds, as PUT .../system-prompt takes them; without it (or for a field "
        "it omits) the active version's are kept",
    )
    _tenant_cmd(sub, "prompt-versions", "list the system prompt versions, newest first")
    _version_cmd(sub, "show-prompt", "print one system prompt version with its text")
    _version_cmd(
        sub,
        "activate-prompt",
        "make an existing version active (rollback or roll forward); gateways pin it before "
        "traffic switches to it, then unpin the old version",
    )
    p = _tenant_cmd(sub, "create-key", "create an API key (printed once)")
    p.add_argument("--kind", choices=("server", "widget"), required=True)
    p.add_argument(
        "--origin",
        action="append",
        default=[],
        dest="origins",
        help="an origin (https://host[:port]) a widget key may be used from; repeat for more; "
        "a widget key needs at least one",
    )
    _add_limits(p, KEY_LIMIT_OPTS)
    _tenant_cmd(sub, "list-keys", "list a tenant's keys with their limits (never the keys)")
    p = _tenant_cmd(sub, "revoke-key", "revoke an API key")
    p.add_argument("key_id")
    p = _tenant_cmd(
        sub,
        "set-key-limits",
        "replace a key's own limits (an omitted one: only the tenant's applies)",
    )
    p.add_argument("key_id")
    _add_limits(p, KEY_LIMIT_OPTS)
    p = _tenant_cmd(sub, "set-limits", "change the limits given; the others stay as they are")
    p.add_argument(
        "--replace",
        action="store_true",
        help="replace all four limits: an omitted one reverts to the default from settings",
    )
    _add_limits(p)
    p = _tenant_cmd(sub, "delete-conversation", "delete one stored conversation (audited)")
    p.add_argument("conversation_id")
    p = _tenant_cmd(
        sub,
        "delete-end-user",
        "delete everything an end user stored: conversations, responses, items (audited)",
    )
    p.add_argument("end_user", help="the end user id (a widget session's end_user_id)")
    p = sub.add_parser("audit", help="show the audit log, newest first")
    p.add_argument("--tenant", help="only this tenant's rows")
    p.add_argument("--limit", type=int, default=50, help="rows to show (1..200, default 50)")
    add_admin_commands(sub)
    for action in sub.choices.values():
        _common(action)
    return root


def _prompt_text(args: argparse.Namespace) -> str | None:
    if args.prompt_file is None:
        prompt: str | None = args.prompt
        return prompt
    if args.prompt_file == "-":
        return sys.stdin.read()
    return Path(args.prompt_file).read_text(encoding="utf-8")


def _given(args: argparse.Namespace, names: Sequence[str]) -> dict[str, Any]:
    """The limits given on the command line (an omitted option is not a key)."""
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def _print(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True))


def _dump(model: BaseModel) -> None:
    _print(model.model_dump(mode="json"))


async def _create(store: TenantStore, args: argparse.Namespace) -> None:
    data = parse(
        TenantCreate,
        {
            "id": args.id,
            "name": args.name,
            "system_prompt": _prompt_text(args),
            "limits": _given(args, LIMIT_OPTS),
            "allow_client_system": not args.no_client_system,
        },
    )
    _dump(await store.create_tenant(data, actor=ACTOR))


async def _list(store: TenantStore, args: argparse.Namespace) -> None:
    cursor: str | None = None
    print(f"{'ID':<24} {'STATUS':<10} {'PROMPT':>6}  NAME")
    while True:
        page = await store.list_tenants(limit=200, cursor=cursor, status=args.status)
        for t in page.data:
            version = "-" if t.prompt_version is None else str(t.prompt_version)
            print(f"{t.id:<24} {t.status:<10} {version:>6}  {t.name}")
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


async def _show(store: TenantStore, args: argparse.Namespace) -> None:
    _dump(await store.get_tenant(args.id))


def _status_change(status: Literal["active", "suspended"]) -> Action:
    async def run(store: TenantStore, args: argparse.Namespace) -> None:
        tenant = await store.update_tenant(args.id, TenantPatch(status=status), actor=ACTOR)
        print(f"tenant {tenant.id} is {tenant.status}")

    return run


async def _set_policy(store: TenantStore, args: argparse.Namespace) -> None:
    fields = _given(args, ("name", "conversation_retention_days"))
    for dest, _ in POLICY_SWITCHES.values():
        value = getattr(args, dest)
        if value is not None:
            fields[dest] = value == "on"
    if not fields:
        raise ConfigError("set-policy", "nothing to change (see kvgate tenants set-policy --help)")
    _dump(await store.update_tenant(args.id, parse(TenantPatch, fields), actor=ACTOR))


async def _delete(store: TenantStore, args: argparse.Namespace) -> None:
    tenant = await store.delete_tenant(args.id, actor=ACTOR)
    print(f"tenant {tenant.id} is {tenant.status}")


async def _set_prompt(store: TenantStore, args: argparse.Namespace) -> None:
    body: dict[str, Any] = {"text": _prompt_text(args) or ""}
    if args.tools_file is not None:
        spec = json.loads(Path(args.tools_file).read_text(encoding="utf-8"))
        body.update({"tools": spec} if isinstance(spec, list) else spec)
    tool_store = ToolStore(store)  # omitted tools and options: the active version's
    data, carry = prepare_version(body, await tool_store.active_version(args.id))
    out = await tool_store.set_prompt(args.id, data, actor=ACTOR, carry=carry)
    tools = len(data.tools or ())
    print(f"tenant {args.id}: system prompt version {out.version} is active ({tools} tools)")
    if out.webhook_secret is not None:
        print(f"webhook signing secret (shown once): {out.webhook_secret}")


async def _prompt_versions(store: TenantStore, args: argparse.Namespace) -> None:
    print(f"{'VERSION':>7}  {'ACTIVE':<6}  {'CREATED':<25}  {'CHARS':>7}  {'SHA256':<12}  BY")
    for p in await store.list_prompts(args.id):
        active = "yes" if p.active else ""
        created = p.created_at.isoformat(timespec="seconds")
        print(
            f"{p.version:>7}  {active:<6}  {created:<25}  {len(p.text):>7}  "
            f"{p.sha256[:12]:<12}  {p.created_by}"
        )


async def _show_prompt(store: TenantStore, args: argparse.Namespace) -> None:
    _dump(await store.get_prompt(args.id, args.version))


async def _activate_prompt(store: TenantStore, args: argparse.Namespace) -> None:
    out = await store.activate_prompt(args.id, args.version, actor=ACTOR)
    if out.changed:
        print(f"tenant {args.id}: version {out.version} is active (was {out.previous_version})")
    else:
        print(f"tenant {args.id}: version {out.version} was already active")


async def _create_key(store: TenantStore, args: argparse.Namespace) -> None:
    body = {"kind": args.kind, "allowed_origins": args.origins}
    limits = _given(args, KEY_LIMIT_OPTS)
    if limits:
        body["limits"] = limits
    created = await store.create_key(args.id, parse(KeyCreate, body), actor=ACTOR)
    print(f"key id: {created.id}\nkey:    {created.key}\n(the key is shown only this once)")


async def _list_keys(store: TenantStore, args: argparse.Namespace) -> None:
    _print([k.model_dump(mode="json") for k in await store.list_keys(args.id)])


async def _revoke_key(store: TenantStore, args: argparse.Namespace) -> None:
    key = await store.revoke_key(args.id, args.key_id, actor=ACTOR)
    print(f"key {key.id} revoked at {key.revoked_at.isoformat() if key.revoked_at else '?'}")


async def _set_key_limits(store: TenantStore, args: argparse.Namespace) -> None:
    limits = parse(KeyLimitsIn, _given(args, KEY_LIMIT_OPTS))
    _dump((await store.set_key_limits(args.id, args.key_id, limits, actor=ACTOR)).limits)


async def _set_limits(store: TenantStore, args: argparse.Namespace) -> None:
    limits = parse(LimitsIn, _given(args, LIMIT_OPTS))
    tenant = await store.set_limits(args.id, limits, actor=ACTOR, replace=args.replace)
    _dump(tenant.limits)


async def _audit(store: TenantStore, args: argparse.Namespace) -> None:
    page = await store.list_audit(tenant_id=args.tenant, limit=args.limit)
    for row in page.data:
        at = row.at.isoformat(timespec="seconds")
        details = json.dumps(row.details, sort_keys=True)
        print(
            f"{row.id:>6}  {at}  {row.actor:<10} {row.action:<16} {row.tenant_id or '-'}  {details}"
        )


async def _delete_conversation(store: TenantStore, args: argparse.Namespace) -> None:
    purged = await ConversationAdmin(store).delete_conversation(
        args.id, args.conversation_id, actor=ACTOR
    )
    _print({"deleted": True, **purged_body(purged)})


async def _delete_end_user(store: TenantStore, args: argparse.Namespace) -> None:
    owner = end_user_owner(args.end_user)
    purged = await ConversationAdmin(store).delete_owner(args.id, owner, actor=ACTOR)
    _print({"deleted": True, **purged_body(purged)})


Action = Callable[[TenantStore, argparse.Namespace], Awaitable[None]]
ACTIONS: dict[str, Action] = {
    "create": _create,
    "list": _list,
    "show": _show,
    "suspend": _status_change("suspended"),
    "resume": _status_change("active"),
    "delete": _delete,
    "set-policy": _set_policy,
    "set-prompt": _set_prompt,
    "prompt-versions": _prompt_versions,
    "show-prompt": _show_prompt,
    "activate-prompt": _activate_prompt,
    "create-key": _create_key,
    "list-keys": _list_keys,
    "revoke-key": _revoke_key,
    "set-key-limits": _set_key_limits,
    "set-limits": _set_limits,
    "delete-conversation": _delete_conversation,
    "delete-end-user": _delete_end_user,
    "audit": _audit,
    **ADMIN_ACTIONS,
}


async def _tenants(settings: TenantStoreSettings, args: argparse.Namespace) -> None:
    from tenants.migrate import check_schema

    bus = EventBus()
    bridge = None
    if settings.redis_url:
        bridge = RedisEventBridge.from_url(bus, settings.redis_url, settings.event_channel)
        bus.add_forwarder(bridge.send)
    store = TenantStore.open(
        settings.database_url,
        bus=bus,
        default_limits=settings.default_limits,
        secrets=settings.secrets,  # loaded and checked only by a command that needs it
    )
    try:
        await check_schema(store.engine)
        await ACTIONS[args.action](store, args)
    finally:
        await store.aclose()
        if bridge is not None:
            await bridge.aclose()


def settings_from_env(database_url: str | None) -> TenantStoreSettings:
    env = dict(os.environ)
    if database_url:
        env["KVGATE_DATABASE_URL"] = database_url
    return TenantStoreSettings.from_env(env)


def main(argv: Sequence[str]) -> int:
    command, rest = argv[0], list(argv[1:])
    return reported(command, lambda: _main(command, rest))


def _main(command: str, rest: list[str]) -> int:
    if command == "migrate":
        p = argparse.ArgumentParser(prog="kvgate migrate", description="upgrade schema to head")
        _common(p)
        args = p.parse_args(rest)
        settings = settings_from_env(args.database_url)
        from tenants.migrate import upgrade_to_head

        asyncio.run(upgrade_to_head(settings.database_url, settings.secrets))
        print("tenant database schema is at head")
        return 0
    args = build_parser().parse_args(rest)
    asyncio.run(_tenants(settings_from_env(args.database_url), args))
    return 0


def reported(command: str, work: Callable[[], int]) -> int:
    """``work``'s exit code; a configuration error is one line and exit 2, a store error (the
    database unreachable included) one line and exit 1."""
    try:
        return work()
    except ConfigError as exc:
        print(f"kvgate {command}: configuration error: {exc}", file=sys.stderr)
        return 2
    except (TenantStoreError, OSError) as exc:
        print(f"kvgate {command}: error: {exc}", file=sys.stderr)
        return 1
