"""Operators' deletions of stored conversations, audited: one conversation of a tenant, and
everything one end user stored in a tenant (a data-subject request). Used by the admin API
(gateway/admin/conversations.py) and ``kvgate tenants delete-conversation`` /
``delete-end-user``. Each is one transaction with its audit row; the audit row names ids and
counts, never content. A tenant that does not exist is ``TenantNotFound``; a conversation that
is not the tenant's is ``ConversationNotFound``.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from tenants.conversation_records import Purged, TenantScope
from tenants.conversations import delete_conversation
from tenants.service import lock_tenant, write_audit
from tenants.store import TenantStore
from tenants.stored_responses import delete_owner

END_USER_OWNER = "user:"  # the owner of a widget session's end user (gateway/responses/owner.py)


def end_user_owner(end_user: str) -> str:
    return f"{END_USER_OWNER}{end_user}"


def _counts(purged: Purged) -> dict[str, int]:
    return {
        "conversations": purged.conversations,
        "responses": purged.responses,
        "items": purged.items,
    }


async def delete_tenant_conversation(
    session: AsyncSession, tenant_id: str, conv_id: str, *, actor: str
) -> Purged:
    await lock_tenant(session, tenant_id, allow_deleted=True)
    purged = await delete_conversation(session, TenantScope(tenant_id), conv_id)
    details = {"conversation_id": conv_id, **_counts(purged)}
    await write_audit(session, actor, "conversation.delete", tenant_id, details)
    return purged


async def delete_end_user_data(
    session: AsyncSession, tenant_id: str, owner: str, *, actor: str
) -> Purged:
    await lock_tenant(session, tenant_id, allow_deleted=True)
    purged = await delete_owner(session, tenant_id, owner)
    details = {"owner": owner, **_counts(purged)}
    await write_audit(session, actor, "conversation.delete_owner", tenant_id, details)
    return purged


class ConversationAdmin:
    def __init__(self, store: TenantStore) -> None:
        self.store = store

    async def delete_conversation(self, tenant_id: str, conv_id: str, *, actor: str) -> Purged:
        return await self.store.write(
            lambda s: delete_tenant_conversation(s, tenant_id, conv_id, actor=actor)
        )

    async def delete_owner(self, tenant_id: str, owner: str, *, actor: str) -> Purged:
        """``owner``: ``end_user_owner(id)`` for an end user, ``key:<key id>`` for a key's."""
        return await self.store.write(
            lambda s: delete_end_user_data(s, tenant_id, owner, actor=actor)
        )


def purged_body(purged: Purged) -> dict[str, int]:
    return _counts(purged)
