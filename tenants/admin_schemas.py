"""Schemas of admin principals (``/admin/v1/admins``); the token appears once, in ``AdminCreated``.

``scope`` is ``"platform"`` (every tenant, the cluster, prices) or a tenant id (that tenant's
prompts, keys, widget, key limits and budgets, usage, audit); ``access`` is ``editor`` (reads
and writes) or ``viewer`` (reads only).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import Field, field_validator

from tenants.schemas import TENANT_ID_RE, RequestModel, ResponseModel

PLATFORM = "platform"
Access = Literal["editor", "viewer"]
AdminStatus = Literal["active", "expired", "revoked"]


class AdminCreate(RequestModel):
    scope: str = Field(min_length=1, max_length=63)
    access: Access
    # strict mode would refuse the ISO string a JSON body carries: parse it leniently
    expires_at: datetime | None = Field(default=None, strict=False)
    name: str | None = Field(default=None, min_length=1, max_length=200)

    @field_validator("scope")
    @classmethod
    def _scope(cls, value: str) -> str:
        if value != PLATFORM and not TENANT_ID_RE.fullmatch(value):
            raise ValueError('must be "platform" or a tenant id')
        return value

    @field_validator("expires_at")
    @classmethod
    def _future(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        if value <= datetime.now(UTC):
            raise ValueError("must be in the future")
        return value

    @property
    def tenant_id(self) -> str | None:
        return None if self.scope == PLATFORM else self.scope


class AdminOut(ResponseModel):
    id: str
    scope: str
    access: Access
    name: str | None
    created_at: datetime
    created_by: str
    expires_at: datetime | None
    revoked_at: datetime | None
    status: AdminStatus

    @property
    def tenant_id(self) -> str | None:
        return None if self.scope == PLATFORM else self.scope


class AdminCreated(AdminOut):
    token: str  # shown only in this answer; the store keeps its SHA-256


class AdminList(ResponseModel):
    data: list[AdminOut]
