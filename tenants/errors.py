"""Domain errors of the tenant store.

They carry no HTTP knowledge; ``gateway/admin`` maps them to statuses with ``register_error``.
``param`` names the offending request field (OpenAI error ``param``) where one applies.
"""

from __future__ import annotations


class TenantStoreError(Exception):
    """Base class of every tenant-store error."""

    param: str | None = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class TenantNotFound(TenantStoreError):
    def __init__(self, tenant_id: str) -> None:
        super().__init__(f"tenant {tenant_id!r} not found", param="id")
        self.tenant_id = tenant_id


class KeyNotFound(TenantStoreError):
    def __init__(self, key_id: str) -> None:
        super().__init__(f"key {key_id!r} not found", param="key_id")
        self.key_id = key_id


class PromptVersionNotFound(TenantStoreError):
    def __init__(self, tenant_id: str, version: int) -> None:
        super().__init__(
            f"tenant {tenant_id!r} has no system prompt version {version}", param="version"
        )
        self.tenant_id = tenant_id
        self.version = version


class TenantExists(TenantStoreError):
    def __init__(self, tenant_id: str) -> None:
        super().__init__(f"tenant {tenant_id!r} already exists", param="id")
        self.tenant_id = tenant_id


class InvalidField(TenantStoreError):
    """A request field failed validation; ``param`` is its dotted path (``limits.rpm``)."""


class PromptTooLong(InvalidField):
    def __init__(self, num_tokens: int, limit: int, *, param: str = "text") -> None:
        super().__init__(
            f"system prompt is {num_tokens} tokens; the model allows at most {limit}", param=param
        )
        self.num_tokens = num_tokens
        self.limit = limit


class PromptChanged(TenantStoreError):
    """A new version carried fields forward from the active version, and another write made a
    different version active before it committed: carrying from that one was not asked for."""

    def __init__(self, tenant_id: str, expected: int | None, active: int | None) -> None:
        super().__init__(
            f"the active system prompt of tenant {tenant_id!r} changed (version {expected} -> "
            f"{active}) while this version carried fields from it; send the request again",
            param="id",
        )
        self.tenant_id = tenant_id


class StoreUnavailable(TenantStoreError):
    """The database could not be reached; the unit of work was rolled back entirely."""


class SchemaOutdated(TenantStoreError):
    """The database schema is not at the revision this code expects."""


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the environment variable."""

    def __init__(self, variable: str, message: str) -> None:
        super().__init__(f"{variable}: {message}")
        self.variable = variable


class TenantDeleted(TenantStoreError):
    """A change other than restoring was attempted on a soft-deleted tenant."""

    def __init__(self, tenant_id: str) -> None:
        super().__init__(
            f"tenant {tenant_id!r} is deleted; restore it with PATCH status=active first",
            param="id",
        )
        self.tenant_id = tenant_id


class AdminNotFound(TenantStoreError):
    def __init__(self, admin_id: str) -> None:
        super().__init__(f"admin {admin_id!r} not found", param="admin_id")
        self.admin_id = admin_id
