"""Tenant change events: an in-process bus, optionally bridged to Redis pub/sub.

Events are published only after their transaction commits, so a listener that re-reads the
database sees the change. Listener failures are logged and never reach the publisher.

Replicas: ``RedisEventBridge`` forwards locally published events to a Redis channel and delivers
events from other replicas to the local bus (each message carries its origin id, so a replica
never re-delivers its own events).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

import structlog

log = structlog.get_logger(__name__)

# ``admins``: an admin principal changed (revoked); ``tenant_id`` is its tenant, "" for a
# platform admin. Listeners of tenant state ignore it; the admin token cache drops what it holds.
ChangeKind = Literal["created", "updated", "prompt", "limits", "keys", "deleted", "admins"]
CHANGE_KINDS: tuple[str, ...] = (
    "created",
    "updated",
    "prompt",
    "limits",
    "keys",
    "deleted",
    "admins",
)

# What a ``keys`` event did to its key.
KeyChange = Literal["created", "revoked", "limits", "priority"]
KEY_CHANGES: tuple[str, ...] = ("created", "revoked", "limits", "priority")

# Which settings an ``updated`` event changed. Listeners act on each group alone:
#   status   the tenant's status (the event's ``status`` says which)
#   profile  display fields (name): refuses nothing
#   policy   what traffic is accepted (allow_client_system, the widget's require_session,
#            allow_client_system and max_choices): may refuse traffic, and the event does not
#            say how
#   widget   widget look and per-visitor limits: refuses nothing
#   secret   the widget session secret (created or rotated): tokens signed before stop verifying
SettingGroup = Literal["status", "profile", "policy", "widget", "secret"]
SETTING_GROUPS: tuple[str, ...] = ("status", "profile", "policy", "widget", "secret")
TENANT_STATUSES: tuple[str, ...] = ("active", "suspended", "deleted")


@dataclass(frozen=True)
class TenantChanged:
    """One committed change of a tenant, saying exactly what changed (never a secret).

    ``kind`` keys: ``key_id`` and ``key_change`` name the key and what happened to it.
    ``kind`` created / updated / deleted: ``status`` is the tenant's status after the change;
    updated: ``groups`` lists the setting groups it touched. An event without these details
    (published by an older replica) means "something of this kind changed": listeners then
    assume the worst (every key may be revoked, every setting may refuse traffic).
    """

    tenant_id: str
    kind: ChangeKind
    prompt_version: int | None = None
    key_id: str | None = None
    key_change: KeyChange | None = None
    status: str | None = None
    groups: tuple[SettingGroup, ...] = ()

    def __post_init__(self) -> None:
        assert (self.key_id is None) == (self.key_change is None), "key id without its change"
        assert self.key_id is None or self.kind == "keys", "a key id on a non-key event"
        assert not self.groups or self.kind == "updated", "setting groups on a non-update event"

    @property
    def exact(self) -> bool:
        """Whether the event spells out its change (else: an older replica's coarse event)."""
        if self.kind == "keys":
            return self.key_id is not None
        if self.kind == "updated":
            return bool(self.groups)
        return True

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["groups"] = list(self.groups)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TenantChanged:
        """Parse a bridged event; fields an older replica does not send are left unset."""
        kind = _one_of(data["kind"], CHANGE_KINDS, "change kind")
        version = data.get("prompt_version")
        key_id = data.get("key_id")
        key_change = _optional(data, "key_change", KEY_CHANGES)
        groups = data.get("groups") or ()
        if not isinstance(groups, list | tuple):
            raise ValueError("groups must be a list")
        if (key_id is None) != (key_change is None) or (key_id is not None and kind != "keys"):
            raise ValueError("key id and key change go together, on key events")
        if groups and kind != "updated":
            raise ValueError("setting groups belong to update events")
        return cls(
            tenant_id=str(data["tenant_id"]),
            kind=kind,
            prompt_version=None if version is None else int(version),
            key_id=None if key_id is None else str(key_id),
            key_change=key_change,
            status=_optional(data, "status", TENANT_STATUSES),
            groups=tuple(_one_of(g, SETTING_GROUPS, "setting group") for g in groups),
        )


def _optional(data: dict[str, Any], name: str, allowed: tuple[str, ...]) -> Any:
    value = data.get(name)
    return None if value is None else _one_of(value, allowed, name)


def _one_of(value: Any, allowed: tuple[str, ...], what: str) -> Any:
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}")
    return value


Listener = Callable[[TenantChanged], Awaitable[None]]


class EventBus:
    """In-process fan-out of ``TenantChanged`` to async listeners, in subscription order."""

    def __init__(self) -> None:
        self._listeners: list[Listener] = []
        self._forwarders: list[Listener] = []

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Add a listener; returns a function that removes it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def add_forwarder(self, forwarder: Listener) -> Callable[[], None]:
        """Forwarders see only locally published events (used by the Redis bridge)."""
        self._forwarders.append(forwarder)
        return lambda: self._forwarders.remove(forwarder)

    async def publish(self, event: TenantChanged) -> None:
        """A change made by this process: local listeners, then forwarders."""
        await self.deliver(event)
        for forwarder in list(self._forwarders):
            await _call(forwarder, event)

    async def deliver(self, event: TenantChanged) -> None:
        """A change to announce to local listeners only (e.g. received from another replica)."""
        for listener in list(self._listeners):
            await _call(listener, event)


async def _call(listener: Listener, event: TenantChanged) -> None:
    try:
        await listener(event)
    except Exception:
        log.exception("tenant_event_listener_failed", tenant=event.tenant_id, kind=event.kind)


class RedisEventBridge:
    """Bridges an ``EventBus`` to a Redis pub/sub channel (``redis.asyncio`` client).

    Redis may be away at start, or go away later: ``start`` tries once (within ``timeout_s``),
    then keeps trying in the background, never failing; a dropped subscription is re-established
    with capped exponential backoff. Events published meanwhile are lost (a replica's caches
    expire by their TTL), so ``on_resync`` (when given) is awaited after each re-subscription
    for the owner to reload whatever it caches. Publishing never fails the publisher: an event
    that cannot reach Redis within ``timeout_s`` is logged (kind only) and dropped.
    """

    def __init__(
        self,
        bus: EventBus,
        redis: Any,
        channel: str,
        *,
        on_resync: Callable[[], Awaitable[None]] | None = None,
        retry_s: float = 0.5,
        max_retry_s: float = 10.0,
        timeout_s: float = 2.0,
    ) -> None:
        self._bus = bus
        self._redis = redis
        self.channel = channel
        self.origin = secrets.token_hex(8)
        self._on_resync = on_resync
        self._retry_s = retry_s
        self._max_retry_s = max_retry_s
        self._timeout_s = timeout_s
        self.connected = False  # subscribed right now
        self._task: asyncio.Task[None] | None = None
        self._remove_forwarder: Callable[[], None] | None = None

    @classmethod
    def from_url(cls, bus: EventBus, url: str, channel: str, **kwargs: Any) -> RedisEventBridge:
        import redis.asyncio as aioredis

        timeout_s = float(kwargs.get("timeout_s", 2.0))
        client = aioredis.from_url(url, socket_connect_timeout=timeout_s)
        return cls(bus, client, channel, **kwargs)

    async def start(self) -> None:
        """Subscribe, then begin forwarding. Redis unreachable: start anyway (degraded) and
        subscribe in the background as soon as it answers."""
        try:
            pubsub = await self._subscribe()
        except Exception as exc:
            log.warning("tenant_events_redis_unavailable", channel=self.channel, error=_name(exc))
            pubsub = None
        self._task = asyncio.create_task(self._run(pubsub))
        self._remove_forwarder = self._bus.add_forwarder(self.send)

    async def send(self, event: TenantChanged) -> None:
        message = json.dumps({"origin": self.origin, "event": event.to_json()})
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._redis.publish(self.channel, message)
        except Exception as exc:  # TimeoutError included
            log.warning(
                "tenant_event_not_sent", channel=self.channel, kind=event.kind, error=_name(exc)
            )

    async def _subscribe(self) -> Any:
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        try:
            async with asyncio.timeout(self._timeout_s):
                await pubsub.subscribe(self.channel)
        except BaseException:
            with contextlib.suppress(Exception):
                await pubsub.aclose()
            raise
        self.connected = True
        return pubsub

    async def _run(self, pubsub: Any) -> None:
        if pubsub is None:
            pubsub = await self._resubscribe()
        while True:
            try:
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        await self._handle(message["data"])
                return  # listen() ends only after an unsubscribe
            except Exception as exc:
                log.warning("tenant_events_redis_lost", channel=self.channel, error=_name(exc))
            finally:
                self.connected = False
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
            pubsub = await self._resubscribe()
            if self._on_resync is not None:
                try:
                    await self._on_resync()
                except Exception:
                    log.exception("tenant_events_resync_failed", channel=self.channel)

    async def _resubscribe(self) -> Any:
        delay = self._retry_s
        while True:
            await asyncio.sleep(delay)
            try:
                pubsub = await self._subscribe()
            except Exception as exc:
                log.debug("tenant_events_redis_retry", channel=self.channel, error=_name(exc))
                delay = min(delay * 2, self._max_retry_s)
                continue
            log.info("tenant_events_redis_resubscribed", channel=self.channel)
            return pubsub

    async def _handle(self, raw: bytes | str) -> None:
        try:
            payload = json.loads(raw)
            if payload.get("origin") == self.origin:
                return
            event = TenantChanged.from_json(payload["event"])
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("tenant_event_malformed", channel=self.channel)
            return
        await self._bus.deliver(event)

    async def aclose(self, *, close_client: bool = True) -> None:
        if self._remove_forwarder is not None:
            self._remove_forwarder()
            self._remove_forwarder = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if close_client:
            await self._redis.aclose()


def _name(exc: BaseException) -> str:
    """An error's class name: messages may carry a URL with credentials."""
    return type(exc).__name__
