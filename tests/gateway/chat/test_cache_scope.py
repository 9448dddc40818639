"""The cache scope of a request (gateway/chat/cache_scope.py): per end user, tenant-salted."""

from __future__ import annotations

import dataclasses

from engine.remote.vllm_wire import vllm_salt
from gateway.access.auth import Principal
from gateway.chat.cache_scope import SALT_BYTES, derive, end_user_identity, shared_with_tenant
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


def _vllm_salt(backend: str, on: bool, identity: str, salt: str = "salt-1") -> str:
    """The cache_salt a request of ``identity`` carries to vLLM (the tenant prefix: 300 tokens)."""
    rt = dataclasses.replace(principal("server", salt=salt).runtime, vllm_visitor_salt=on)
    return vllm_salt(salt, derive(salt, identity, shared_with_tenant(backend, rt, 300)))


def test_the_vllm_salt_is_per_visitor_only_with_the_tenant_setting() -> None:
    tenant_only = vllm_salt("salt-1", None)
    # off: every visitor of the tenant carries the tenant's salt
    assert _vllm_salt("vllm", False, "user:ann") == _vllm_salt("vllm", False, "user:bob")
    assert _vllm_salt("vllm", False, "user:ann") == tenant_only
    # on: distinct per visitor, stable for one, never the tenant's nor the raw secret
    ann, bob = _vllm_salt("vllm", True, "user:ann"), _vllm_salt("vllm", True, "user:bob")
    assert ann != bob and ann == _vllm_salt("vllm", True, "user:ann")
    assert tenant_only not in (ann, bob)
    assert ann != _vllm_salt("vllm", True, "user:ann", salt="salt-2")  # another tenant's
    for digest in (ann, bob, tenant_only):
        assert len(digest) == 32 and int(digest, 16) >= 0  # 32 hex: what vLLM takes
        assert "salt-1" not in digest and "ann" not in digest
    # kvgate's own engine: the setting changes nothing, the tenant prefix stays shared
    rt = dataclasses.replace(principal("server").runtime, vllm_visitor_salt=True)
    assert shared_with_tenant("kvgate", rt, 300) == 300
    assert shared_with_tenant("vllm", rt, 300) == 0
