"""Prompt activation (rollback / roll forward) and partial limit updates in the store."""

from __future__ import annotations

import asyncio

import pytest

from tenants.errors import PromptVersionNotFound, TenantDeleted
from tenants.schemas import LimitsIn
from tenants.store import TenantStore
from tests.tenants.factories import make_tenant


async def test_new_versions_after_a_rollback_race_with_activations(store: TenantStore) -> None:
    """After a rollback the active version is not the newest: concurrent set-prompts still get
    distinct numbers after the newest, while activations of old versions interleave."""
    tid = await make_tenant(store, system_prompt="v1")
    for text in ("v2", "v3"):
        await store.set_system_prompt(tid, text, actor="t")
    assert (await store.activate_prompt(tid, 1, actor="t")).previous_version == 3
    await store.check_integrity()
    n = 6
    results = await asyncio.gather(
        *(store.set_system_prompt(tid, f"new {i}", actor="t") for i in range(n)),
        *(store.activate_prompt(tid, v, actor="t") for v in (2, 1, 3, 2)),
    )
    assert sorted(results[:n]) == list(range(4, 4 + n))  # type: ignore[type-var]
    await store.check_integrity()
    prompts = await store.list_prompts(tid)
    assert [p.version for p in prompts] == list(range(3 + n, 0, -1))
    assert sum(p.active for p in prompts) == 1


async def test_activation_errors_and_audit(store: TenantStore) -> None:
    tid = await make_tenant(store, system_prompt="v1")
    with pytest.raises(PromptVersionNotFound):
        await store.activate_prompt(tid, 2, actor="t")
    await store.set_system_prompt(tid, "v2", actor="t")
    out = await store.activate_prompt(tid, 1, actor="ops")
    assert (out.version, out.previous_version, out.changed) == (1, 2, True)
    (row, *_) = (await store.list_audit(tenant_id=tid)).data
    assert (row.actor, row.action) == ("ops", "prompt.activate")
    assert row.details["version"] == 1 and row.details["previous_version"] == 2
    assert row.details["length"] == 2 and "v1" not in str(row.details)
    await store.delete_tenant(tid, actor="t")
    with pytest.raises(TenantDeleted):
        await store.activate_prompt(tid, 2, actor="t")


async def test_set_limits_changes_only_the_given_fields(store: TenantStore) -> None:
    tid = await make_tenant(store)
    await store.set_limits(tid, LimitsIn(rpm=5, tpm=50), actor="t")
    out = await store.set_limits(tid, LimitsIn(max_concurrency=3), actor="t", replace=False)
    assert out.limits.model_dump() == {
        "rpm": 5,
        "tpm": 50,
        "max_concurrency": 3,
        "max_output_tokens": None,
        "weight": None,
    }
    # An explicit null resets that one limit to the default; the others stay.
    out = await store.set_limits(tid, LimitsIn(rpm=None), actor="t", replace=False)
    assert (out.limits.rpm, out.limits.tpm) == (None, 50)
    out = await store.set_limits(tid, LimitsIn(tpm=7), actor="t")  # replace: all four
    assert out.limits.model_dump() == {
        "rpm": None,
        "tpm": 7,
        "max_concurrency": None,
        "max_output_tokens": None,
        "weight": None,
    }
    (row, *_) = (await store.list_audit(tenant_id=tid)).data
    assert row.details["after"] == out.limits.model_dump()
