"""``TenantStore``: one transaction per unit of work, events after commit, DB outages mapped.

The admin API and the CLI go through it; the gateway may too, or call the session-taking
functions of tenants/runtime.py, tenants/service.py and tenants/queries.py directly.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from tenants import queries, runtime, service
from tenants.db import (
    SessionFactory,
    is_unavailable,
    make_engine,
    make_session_factory,
    unavailable,
    within,
)
from tenants.errors import StoreUnavailable, TenantExists, TenantStoreError
from tenants.events import EventBus, KeyChange, SettingGroup, TenantChanged
from tenants.health import DbHealth
from tenants.idle import IdleConnections
from tenants.runtime import KeyIdentity, TenantRuntime
from tenants.schemas import (
    AuditPage,
    KeyCreate,
    KeyCreated,
    KeyLimitsIn,
    KeyOut,
    KeyPriorityIn,
    LimitsIn,
    PromptActivated,
    PromptOut,
    TenantCreate,
    TenantOut,
    TenantPage,
    TenantPatch,
)
from tenants.secret_keys import SecretsSettings
from tenants.secret_store import SecretKeeper
from tenants.settings import DEFAULT_LIMITS, Limits

T = TypeVar("T")

# TenantPatch field -> the setting group an ``updated`` event names for it.
_PATCH_GROUPS: dict[str, SettingGroup] = {
    "name": "profile",
    "status": "status",
    "allow_client_system": "policy",
    "conversation_store": "policy",
    "conversation_retention_days": "policy",
    "vllm_visitor_salt": "policy",
}


@contextlib.contextmanager
def _outages_unavailable() -> Iterator[None]:
    """A database that cannot be reached becomes ``StoreUnavailable``; other errors pass."""
    try:
        yield
    except TenantStoreError:
        raise
    except Exception as exc:
        if is_unavailable(exc):
            raise unavailable(exc) from exc
        raise


async def _select_one(session: AsyncSession) -> None:
    await session.execute(text("SELECT 1"))


class TenantStore:
    def __init__(
        self,
        sessions: SessionFactory,
        *,
        bus: EventBus | None = None,
        default_limits: Limits = DEFAULT_LIMITS,
        engine: AsyncEngine | None = None,
        deadline_s: float | None = None,
        health: DbHealth | None = None,
        secrets: SecretsSettings | None = None,
    ) -> None:
        self.sessions = sessions
        self.bus = bus or EventBus()
        self.default_limits = default_limits
        self._engine = engine  # owned (disposed by aclose) only when set
        # The request path's bound on a whole unit of work (None: the CLI, no bound).
        self.deadline_s = deadline_s
        self.health = health or DbHealth(retry_s=0.0)  # the gateway passes a fail-fast one
        # The key that seals MCP bearers and tool secrets (tenants/secret_store.py); None: a
        # store that never touches them (using one raises SecretsKeyError).
        self.secrets = SecretKeeper(secrets, self.write)
        # closed when a unit of work cannot reach the database (tenants/idle.py)
        self.idle = IdleConnections.of(self.engine)

    @classmethod
    def open(
        cls,
        url: str,
        *,
        bus: EventBus | None = None,
        default_limits: Limits = DEFAULT_LIMITS,
        secrets: SecretsSettings | None = None,
    ) -> TenantStore:
        engine = make_engine(url)
        return cls(
            make_session_factory(engine),
            bus=bus,
            default_limits=default_limits,
            engine=engine,
            secrets=secrets,
        )

    @property
    def engine(self) -> AsyncEngine:
        bind = self.sessions.kw.get("bind")
        assert isinstance(bind, AsyncEngine), "session factory is not bound to an AsyncEngine"
        return bind

    async def aclose(self) -> None:
        if self._engine is None:
            return
        # Closing a connection to a server that stopped answering waits for its goodbye:
        # bounded, then the connections are left to the process exit.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.deadline_s):
                await self._engine.dispose()

    async def _write(self, fn: Callable[[AsyncSession], Awaitable[T]]) -> T:
        """Run ``fn`` in one transaction; nothing is left half-written on any failure."""
        return await self._unit(fn, write=True)

    async def _read(self, fn: Callable[[AsyncSession], Awaitable[T]]) -> T:
        return await self._unit(fn, write=False)

    async def write(self, fn: Callable[[AsyncSession], Awaitable[T]]) -> T:
        """A unit of work in one transaction for stores built on this one (tenants/widget.py):
        the same deadline, outage mapping and fail-fast rule; announcing events stays theirs."""
        return await self._unit(fn, write=True)

    async def read(self, fn: Callable[[AsyncSession], Awaitable[T]]) -> T:
        return await self._unit(fn, write=False)

    async def _unit(self, fn: Callable[[AsyncSession], Awaitable[T]], *, write: bool) -> T:
        """One unit of work within ``deadline_s``. A database that cannot be reached (or does
        not answer in time) becomes ``StoreUnavailable`` and marks it down; while it is down,
        units of work fail at once except one trial per retry interval (``DbHealth``)."""
        if not self.health.admit():
            raise StoreUnavailable("tenant database unavailable (retrying)")
        try:
            with _outages_unavailable():
                result = await within(self.deadline_s, self._run(fn, write))
        except StoreUnavailable as exc:
            self._failed(exc)
            raise
        except (TenantStoreError, IntegrityError):
            self.health.succeeded()  # the database answered (not found, conflict, ...)
            raise
        self.health.succeeded()
        return result

    async def _run(self, fn: Callable[[AsyncSession], Awaitable[T]], write: bool) -> T:
        async with self.sessions() as session:
            if not write:
                return await fn(session)
            async with session.begin():
                return await fn(session)

    async def ping(self, timeout_s: float) -> bool:
        """One ``SELECT 1`` within ``timeout_s`` (readiness probe); updates ``health``."""
        try:
            with _outages_unavailable():
                await within(timeout_s, self._run(_select_one, False))
        except StoreUnavailable as exc:
            self._failed(exc)
            return False
        self.health.succeeded()
        return True

    def _failed(self, exc: StoreUnavailable) -> None:
        """The database could not be used: marked down, and the pool's idle connections closed
        (one the outage left silent would cost a later unit its whole deadline)."""
        self.health.failed(exc)
        if self.idle is not None:
            self.idle.close_all()

    # -- mutations: commit, then announce -------------------------------------------------
    async def create_tenant(self, data: TenantCreate, *, actor: str) -> TenantOut:
        try:
            out = await self._write(lambda s: service.create_tenant(s, data, actor=actor))
        except IntegrityError as exc:  # lost a race with a concurrent create of the same id
            raise TenantExists(data.id) from exc
        await self.bus.publish(
            TenantChanged(out.id, "created", out.prompt_version, status=out.status)
        )
        return out

    async def update_tenant(self, tenant_id: str, patch: TenantPatch, *, actor: str) -> TenantOut:
        out = await self._write(lambda s: service.update_tenant(s, tenant_id, patch, actor=actor))
        # The groups of the fields given (some may have held their value already).
        groups = tuple(g for f, g in _PATCH_GROUPS.items() if getattr(patch, f) is not None)
        if groups:
            event = TenantChanged(
                tenant_id, "updated", out.prompt_version, status=out.status, groups=groups
            )
            await self.bus.publish(event)
        return out

    async def delete_tenant(self, tenant_id: str, *, actor: str) -> TenantOut:
        out = await self._write(lambda s: service.delete_tenant(s, tenant_id, actor=actor))
        await self.bus.publish(TenantChanged(tenant_id, "deleted", None, status="deleted"))
        return out

    async def set_system_prompt(self, tenant_id: str, text: str, *, actor: str) -> int:
        """A version of text alone (tools: tenants/tool_service.py's ``ToolStore``)."""
        version = await self._write(
            lambda s: service.set_system_prompt(s, tenant_id, text, actor=actor)
        )
        await self.bus.publish(TenantChanged(tenant_id, "prompt", version))
        return version

    async def activate_prompt(self, tenant_id: str, version: int, *, actor: str) -> PromptActivated:
        """Make an existing version active. The same event as set-prompt follows, so listeners
        (the pin manager) pin the version first, then switch traffic, then unpin the old one."""
        out = await self._write(
            lambda s: service.activate_prompt(s, tenant_id, version, actor=actor)
        )
        if out.changed:
            await self.bus.publish(TenantChanged(tenant_id, "prompt", version))
        return out

    async def set_limits(
        self, tenant_id: str, limits: LimitsIn, *, actor: str, replace: bool = True
    ) -> TenantOut:
        out = await self._write(
            lambda s: service.set_limits(s, tenant_id, limits, actor=actor, replace=replace)
        )
        await self.bus.publish(TenantChanged(tenant_id, "limits", out.prompt_version))
        return out

    async def set_key_limits(
        self, tenant_id: str, key_id: str, limits: KeyLimitsIn, *, actor: str
    ) -> KeyOut:
        out = await self._write(
            lambda s: service.set_key_limits(s, tenant_id, key_id, limits, actor=actor)
        )
        await self._key_changed(tenant_id, key_id, "limits")
        return out

    async def set_key_priority(
        self, tenant_id: str, key_id: str, data: KeyPriorityIn, *, actor: str
    ) -> KeyOut:
        out = await self._write(
            lambda s: service.set_key_priority(s, tenant_id, key_id, data, actor=actor)
        )
        await self._key_changed(tenant_id, key_id, "priority")
        return out

    async def create_key(self, tenant_id: str, data: KeyCreate, *, actor: str) -> KeyCreated:
        out = await self._write(lambda s: service.create_key(s, tenant_id, data, actor=actor))
        await self._key_changed(tenant_id, out.id, "created")
        return out

    async def revoke_key(self, tenant_id: str, key_id: str, *, actor: str) -> KeyOut:
        out = await self._write(lambda s: service.revoke_key(s, tenant_id, key_id, actor=actor))
        await self._key_changed(tenant_id, key_id, "revoked")
        return out

    async def _key_changed(self, tenant_id: str, key_id: str, change: KeyChange) -> None:
        await self.bus.publish(TenantChanged(tenant_id, "keys", key_id=key_id, key_change=change))

    # -- reads ----------------------------------------------------------------------------
    async def get_tenant(self, tenant_id: str) -> TenantOut:
        return await self._read(lambda s: queries.get_tenant(s, tenant_id))

    async def list_tenants(
        self, *, limit: int = 50, cursor: str | None = None, status: str | None = None
    ) -> TenantPage:
        return await self._read(
            lambda s: queries.list_tenants(s, limit=limit, cursor=cursor, status=status)
        )

    async def list_prompts(self, tenant_id: str) -> list[PromptOut]:
        return await self._read(lambda s: queries.list_prompts(s, tenant_id))

    async def get_prompt(self, tenant_id: str, version: int) -> PromptOut:
        return await self._read(lambda s: queries.get_prompt(s, tenant_id, version))

    async def list_keys(self, tenant_id: str) -> list[KeyOut]:
        return await self._read(lambda s: queries.list_keys(s, tenant_id))

    async def list_audit(
        self, *, tenant_id: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> AuditPage:
        return await self._read(
            lambda s: queries.list_audit(s, tenant_id=tenant_id, limit=limit, cursor=cursor)
        )

    async def authenticate_key(self, secret: str) -> KeyIdentity | None:
        return await self._read(lambda s: runtime.authenticate_key(s, secret))

    async def get_key_identity(self, key_id: str) -> KeyIdentity | None:
        return await self._read(lambda s: runtime.key_identity(s, key_id))

    async def get_tenant_runtime(self, tenant_id: str) -> TenantRuntime | None:
        return await self._read(
            lambda s: runtime.get_tenant_runtime(s, tenant_id, self.default_limits)
        )

    async def list_active_runtimes(self) -> list[TenantRuntime]:
        return await self._read(lambda s: runtime.list_active_runtimes(s, self.default_limits))

    async def check_integrity(self) -> None:
        await self._read(queries.check_store_integrity)
