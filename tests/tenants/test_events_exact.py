"""Tenant events say exactly what changed: the key and what happened to it, the new status, the
setting groups touched; payloads of older replicas (without these fields) still parse. The widget
store runs under the tenant store's units of work (deadline, fail-fast while the database is down).
"""

from __future__ import annotations

import json
import time

import pytest

from tenants.errors import StoreUnavailable
from tenants.events import TenantChanged
from tenants.health import DbHealth
from tenants.schemas import KeyCreate, KeyLimitsIn, TenantPatch, WidgetSettingsIn
from tenants.store import TenantStore
from tenants.widget import WidgetStore
from tests.tenants.factories import make_tenant


def round_trip(event: TenantChanged) -> TenantChanged:
    return TenantChanged.from_json(json.loads(json.dumps(event.to_json())))


def test_exact_events_round_trip_and_old_payloads_parse() -> None:
    events = [
        TenantChanged("acme", "keys", key_id="key_1", key_change="revoked"),
        TenantChanged("acme", "updated", 3, status="suspended", groups=("status", "profile")),
        TenantChanged("acme", "updated", groups=("policy", "widget")),
        TenantChanged("acme", "deleted", status="deleted"),
    ]
    for event in events:
        assert round_trip(event) == event and event.exact
    # What an older replica sends: no details, so listeners must assume the worst.
    old = TenantChanged.from_json({"tenant_id": "acme", "kind": "keys", "prompt_version": None})
    assert old == TenantChanged("acme", "keys") and not old.exact
    assert not TenantChanged.from_json({"tenant_id": "a", "kind": "updated"}).exact
    assert TenantChanged.from_json({"tenant_id": "a", "kind": "limits"}).exact


@pytest.mark.parametrize(
    "payload",
    [
        {"kind": "keys", "key_id": "k"},  # a key without its change
        {"kind": "keys", "key_id": "k", "key_change": "exploded"},
        {"kind": "prompt", "key_id": "k", "key_change": "revoked"},  # a key on another kind
        {"kind": "updated", "groups": ["everything"]},
        {"kind": "updated", "groups": "status"},
        {"kind": "limits", "groups": ["status"]},
        {"kind": "updated", "status": "gone", "groups": ["status"]},
    ],
)
def test_malformed_details_are_refused(payload: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        TenantChanged.from_json({"tenant_id": "acme", **payload})


async def test_store_and_widget_store_publish_exact_events(store: TenantStore) -> None:
    seen: list[TenantChanged] = []

    async def listen(event: TenantChanged) -> None:
        seen.append(event)

    store.bus.subscribe(listen)
    tid = await make_tenant(store, system_prompt=None)
    key = await store.create_key(tid, KeyCreate(kind="server"), actor="t")
    await store.set_key_limits(tid, key.id, KeyLimitsIn(rpm=5), actor="t")
    await store.revoke_key(tid, key.id, actor="t")
    await store.update_tenant(tid, TenantPatch(status="suspended"), actor="t")
    await store.update_tenant(tid, TenantPatch(name="n", allow_client_system=False), actor="t")
    await store.update_tenant(tid, TenantPatch(), actor="t")  # nothing to change: no event
    widgets = WidgetStore(store)
    await widgets.set(tid, WidgetSettingsIn(title="Hi"), actor="t")
    await widgets.set(tid, WidgetSettingsIn(title="Hi"), actor="t")  # unchanged: no event
    await widgets.set(tid, WidgetSettingsIn(title="Hi", require_session=True), actor="t")
    await widgets.session_secret(tid, actor="t")  # created
    await widgets.session_secret(tid, actor="t")  # existed: no event
    await widgets.rotate_secret(tid, actor="t")
    await store.delete_tenant(tid, actor="t")
    assert seen == [
        TenantChanged(tid, "created", None, status="active"),
        TenantChanged(tid, "keys", key_id=key.id, key_change="created"),
        TenantChanged(tid, "keys", key_id=key.id, key_change="limits"),
        TenantChanged(tid, "keys", key_id=key.id, key_change="revoked"),
        TenantChanged(tid, "updated", status="suspended", groups=("status",)),
        TenantChanged(tid, "updated", status="suspended", groups=("profile", "policy")),
        TenantChanged(tid, "updated", groups=("widget",)),
        TenantChanged(tid, "updated", groups=("policy",)),
        TenantChanged(tid, "updated", groups=("secret",)),
        TenantChanged(tid, "updated", groups=("secret",)),
        TenantChanged(tid, "deleted", status="deleted"),
    ]
    assert all(e.exact for e in seen)


async def test_widget_store_fails_fast_while_the_database_is_down(store: TenantStore) -> None:
    """WidgetStore goes through TenantStore.write/read: while the store's health says down, a
    settings write is refused at once and writes nothing; later writes work again."""
    tid = await make_tenant(store, system_prompt=None)
    widgets = WidgetStore(store)
    await widgets.set(tid, WidgetSettingsIn(title="Before"), actor="t")
    store.health = DbHealth(retry_s=60.0)
    store.health.failed(StoreUnavailable("tenant database unavailable"))
    started = time.monotonic()
    for call in (
        widgets.set(tid, WidgetSettingsIn(title="During"), actor="t"),
        widgets.rotate_secret(tid, actor="t"),
        widgets.session_secret(tid, actor="t"),
        widgets.get(tid),
    ):
        with pytest.raises(StoreUnavailable):
            await call
    assert time.monotonic() - started < 0.5  # no database round trip at all
    store.health.succeeded()
    out = await widgets.get(tid)
    assert out.title == "Before" and not out.session_secret_set
    audit = await store.list_audit(tenant_id=tid)
    assert [row.action for row in audit.data].count("widget.set") == 1
