from __future__ import annotations

import asyncio

import pytest
import structlog
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError, OperationalError

from tenants import service
from tenants.errors import (
    KeyNotFound,
    StoreUnavailable,
    TenantDeleted,
    TenantExists,
    TenantNotFound,
)
from tenants.models import AuditLog, SystemPrompt, Tenant, utcnow
from tenants.schemas import LimitsIn, TenantCreate, TenantPatch
from tenants.settings import DEFAULT_LIMITS, Limits
from tenants.store import TenantStore
from tests.tenants.factories import dump_tables, make_key, make_tenant, unique_id


async def test_create_and_runtime(store: TenantStore) -> None:
    tid = await make_tenant(store, system_prompt="Be brief.", limits=LimitsIn(rpm=7))
    rt = await store.get_tenant_runtime(tid)
    assert rt is not None
    assert (rt.tenant_id, rt.status, rt.prompt_version, rt.prompt_text) == (
        tid,
        "active",
        1,
        "Be brief.",
    )
    assert rt.limits == Limits(7, DEFAULT_LIMITS.tpm, 16, 1024)
    assert rt.allow_client_system is True
    assert len(rt.cache_salt) == 32 and rt.cache_salt not in repr(rt)
    assert await store.get_tenant_runtime("missing") is None
    with pytest.raises(TenantExists):
        await make_tenant(store, tid)
    await store.check_integrity()


async def test_runtime_without_prompt_and_distinct_salts(store: TenantStore) -> None:
    a = await make_tenant(store, "aa", system_prompt=None, allow_client_system=False)
    b = await make_tenant(store, "bb")
    await make_tenant(store, "cc")
    await store.update_tenant("cc", TenantPatch(status="suspended"), actor="t")
    ra, rb = await store.get_tenant_runtime(a), await store.get_tenant_runtime(b)
    assert ra and rb and ra.cache_salt != rb.cache_salt
    assert (ra.prompt_version, ra.prompt_text, ra.allow_client_system) == (None, None, False)
    active = await store.list_active_runtimes()
    assert [r.tenant_id for r in active] == ["aa", "bb"]


async def test_authenticate_key(store: TenantStore) -> None:
    tid = await make_tenant(store)
    kid, key = await make_key(store, tid, "widget", ["https://shop.example"])
    ident = await store.authenticate_key(key)
    assert ident is not None
    assert (ident.tenant_id, ident.key_id, ident.kind) == (tid, kid, "widget")
    assert ident.allowed_origins == ("https://shop.example",)
    # Right prefix, wrong secret; malformed; unknown prefix.
    forged = key[:-4] + ("AAAA" if not key.endswith("AAAA") else "BBBB")
    assert await store.authenticate_key(forged) is None
    assert await store.authenticate_key("not-a-key") is None
    assert await store.authenticate_key("kvg_000000000000_" + "A" * 43) is None
    # Suspended still authenticates (the caller checks status); revoked and deleted do not.
    await store.update_tenant(tid, TenantPatch(status="suspended"), actor="t")
    assert await store.authenticate_key(key) is not None
    kid2, key2 = await make_key(store, tid)
    await store.revoke_key(tid, kid2, actor="t")
    assert await store.authenticate_key(key2) is None
    await store.delete_tenant(tid, actor="t")
    assert await store.authenticate_key(key) is None


async def test_secret_never_stored_or_logged(store: TenantStore) -> None:
    with structlog.testing.capture_logs() as logs:
        tid = await make_tenant(store)
        _, key = await make_key(store, tid)
        assert await store.authenticate_key(key) is not None
    dump = await dump_tables(store)
    secret_part = key.split("_", 2)[2]  # kvg_<prefix>_<secret>; secret may hold "_"
    assert key not in dump and secret_part not in dump
    assert key.split("_")[1] in dump  # the public prefix is stored (sanity check of the scan)
    assert secret_part not in repr(logs)
    salt = (await store.get_tenant_runtime(tid)).cache_salt  # type: ignore[union-attr]
    tenant_json = (await store.get_tenant(tid)).model_dump_json()
    assert salt not in tenant_json and "cache_salt" not in tenant_json
    audit = (await store.list_audit(tenant_id=tid)).model_dump_json()
    assert salt not in audit and secret_part not in audit


async def test_prompt_versions_and_history(store: TenantStore) -> None:
    tid = await make_tenant(store, system_prompt=None)
    assert [await store.set_system_prompt(tid, f"v{i}", actor="t") for i in (1, 2, 3)] == [1, 2, 3]
    prompts = await store.list_prompts(tid)
    assert [(p.version, p.text, p.active) for p in prompts] == [
        (3, "v3", True),
        (2, "v2", False),
        (1, "v1", False),
    ]
    rt = await store.get_tenant_runtime(tid)
    assert rt is not None and (rt.prompt_version, rt.prompt_text) == (3, "v3")
    with pytest.raises(TenantNotFound):
        await store.set_system_prompt("nope", "x", actor="t")
    await store.delete_tenant(tid, actor="t")
    with pytest.raises(TenantDeleted):
        await store.set_system_prompt(tid, "x", actor="t")
    await store.check_integrity()


async def test_one_active_prompt_under_concurrent_updates(store: TenantStore) -> None:
    """Eight set-prompt units of work race on separate connections: versions 1..9 each exist
    once, exactly one is active and it is the newest."""
    tid = await make_tenant(store, system_prompt="v0")
    n = 8
    versions = await asyncio.gather(
        *(store.set_system_prompt(tid, f"text {i}", actor=f"w{i}") for i in range(n))
    )
    assert sorted(versions) == list(range(2, n + 2))
    await store.check_integrity()
    async with store.sessions() as s:
        active = await s.scalar(select(Tenant.active_prompt_version).where(Tenant.id == tid))
        count = await s.scalar(
            select(func.count()).select_from(SystemPrompt).where(SystemPrompt.tenant_id == tid)
        )
        audits = await s.scalar(
            select(func.count()).where(AuditLog.tenant_id == tid, AuditLog.action == "prompt.set")
        )
    assert (active, count, audits) == (n + 1, n + 1, n)
    prompts = await store.list_prompts(tid)
    assert sum(p.active for p in prompts) == 1


async def test_every_mutation_writes_audit(store: TenantStore) -> None:
    tid = await make_tenant(store, actor="alice")
    await store.update_tenant(tid, TenantPatch(name="New"), actor="alice")
    await store.set_system_prompt(tid, "secret-free prompt", actor="alice")
    await store.set_limits(tid, LimitsIn(tpm=5), actor="alice")
    kid, _ = await make_key(store, tid)
    await store.revoke_key(tid, kid, actor="alice")
    await store.delete_tenant(tid, actor="alice")
    page = await store.list_audit(tenant_id=tid)
    actions = [a.action for a in reversed(page.data)]
    assert actions == [
        "tenant.create",
        "tenant.update",
        "prompt.set",
        "limits.set",
        "key.create",
        "key.revoke",
        "tenant.delete",
    ]
    assert {a.actor for a in page.data} == {"alice", "test"}
    prompt_row = next(a for a in page.data if a.action == "prompt.set")
    assert prompt_row.details["length"] == len("secret-free prompt")
    assert "secret-free prompt" not in page.model_dump_json()
    # Idempotent repeats change nothing and write nothing.
    await store.delete_tenant(tid, actor="alice")
    await store.revoke_key(tid, kid, actor="alice")
    assert len((await store.list_audit(tenant_id=tid)).data) == len(actions)


async def test_keys_and_limits_errors(store: TenantStore) -> None:
    tid = await make_tenant(store)
    with pytest.raises(KeyNotFound):
        await store.revoke_key(tid, "key_nope", actor="t")
    other = await make_tenant(store)
    kid, _ = await make_key(store, other)
    with pytest.raises(KeyNotFound):  # a key of another tenant
        await store.revoke_key(tid, kid, actor="t")
    with pytest.raises(TenantNotFound):
        await store.set_limits("nope", LimitsIn(), actor="t")
    out = await store.set_limits(tid, LimitsIn(rpm=1, max_output_tokens=9), actor="t")
    assert (out.limits.rpm, out.limits.tpm, out.limits.max_output_tokens) == (1, None, 9)


async def test_pagination(store: TenantStore) -> None:
    ids = sorted([await make_tenant(store, f"p{i}") for i in range(5)])
    await store.delete_tenant("p4", actor="t")
    seen, cursor = [], None
    while True:
        page = await store.list_tenants(limit=2, cursor=cursor)
        seen += [t.id for t in page.data]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == ids[:4]
    everything = await store.list_tenants(limit=10, status="all")
    assert [t.id for t in everything.data] == ids
    assert [t.id for t in (await store.list_tenants(status="deleted")).data] == ["p4"]


async def test_failure_mid_unit_leaves_nothing(
    store: TenantStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The audit insert fails after the tenant and prompt rows were flushed: all rolled back."""

    async def broken_audit(*args: object, **kwargs: object) -> None:
        raise OperationalError("INSERT INTO audit_log", {}, ConnectionResetError("gone"))

    monkeypatch.setattr(service, "write_audit", broken_audit)
    tid = unique_id()
    with pytest.raises(StoreUnavailable):
        await store.create_tenant(TenantCreate(id=tid, name="x", system_prompt="p"), actor="t")
    monkeypatch.undo()
    with pytest.raises(TenantNotFound):
        await store.get_tenant(tid)
    assert (await dump_tables(store)) == ""


async def test_database_errors_do_not_carry_parameters(store: TenantStore) -> None:
    """A failed statement's message (which the gateway logs) names no parameter values."""
    orphan = SystemPrompt(
        tenant_id="no-such-tenant",
        version=1,
        text="PROMPT-TEXT-SECRET",
        sha256="0" * 64,
        created_at=utcnow(),
        created_by="t",
    )
    with pytest.raises(IntegrityError) as err:
        async with store.sessions() as session, session.begin():
            session.add(orphan)
    assert "PROMPT-TEXT-SECRET" not in str(err.value)
    assert "no-such-tenant" not in str(err.value)


async def test_unreachable_database_is_unavailable() -> None:
    store = TenantStore.open("postgresql+asyncpg://postgres@127.0.0.1:1/none")
    try:
        with pytest.raises(StoreUnavailable):
            await store.get_tenant("acme")
        with pytest.raises(StoreUnavailable):
            await make_tenant(store)
    finally:
        await store.aclose()


async def test_patch_without_changes_writes_nothing(store: TenantStore) -> None:
    tid = await make_tenant(store, name="Same")
    before = await store.get_tenant(tid)
    out = await store.update_tenant(tid, TenantPatch(name="Same"), actor="t")
    assert out.updated_at == before.updated_at
    assert [a.action for a in (await store.list_audit(tenant_id=tid)).data] == ["tenant.create"]
    await store.update_tenant(tid, TenantPatch(status="suspended"), actor="t")
    row = (await store.list_audit(tenant_id=tid)).data[0]
    assert (row.action, row.details) == (
        "tenant.update",
        {"before": {"status": "active"}, "after": {"status": "suspended"}},
    )
