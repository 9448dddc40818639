"""The cache scope of a request (gateway/chat/cache_scope.py): per end user, tenant-salted."""

from __future__ import annotations

from gateway.access.auth import Principal
from gateway.chat.cache_scope import SALT_BYTES, derive, end_user_identity
from tenants.runtime import KeyIdentity, TenantRuntime
from tenants.settings import Limits


def principal(kind: str, end_user: str | None = None, salt: str = "salt-1") -> Principal:
    rt = TenantRuntime("t1", "active", salt, 1, "Be brief.", Limits(), True)
    return Principal(KeyIdentity("t1", "key_1", kind, ()), rt, end_user_id=end_user)


def test_the_end_user_is_the_session_user_the_visitor_the_user_else_the_key() -> None:
    addr = "198.51.100.7"
    assert end_user_identity(principal("widget", "ann"), "bob", addr) == "user:ann"
    # a browser's `user` names nobody: the visitor is its address
    assert end_user_identity(principal("widget"), "ann", addr) == f"addr:{addr}"
    assert end_user_identity(principal("server"), "ann", addr) == "user:ann"
    assert end_user_identity(principal("server"), None, addr) == "key:key_1"


def test_salts_are_keyed_by_the_tenant_secret_and_hide_the_id() -> None:
    a = derive("salt-1", "user:ann", 40)
    assert a.shared_tokens == 40 and len(a.salt_bytes) == SALT_BYTES
    assert a == derive("salt-1", "user:ann", 40)  # stable: returning visitors find their turns
    assert a.salt_bytes != derive("salt-1", "user:bob", 40).salt_bytes
    assert a.salt_bytes != derive("salt-2", "user:ann", 40).salt_bytes  # another tenant
    assert b"ann" not in a.salt_bytes
