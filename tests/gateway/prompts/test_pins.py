"""Pin lifecycle: start-up order and cap, prompt changes with in-flight requests, suspension."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import update

from engine.api import LocalPin, PinTicket
from engine.core.kv import PinHandle
from engine.runtime.snapshot import namespace_digest
from gateway.prompts.pins import PINNED, PinManager
from tenants.models import ApiKey
from tenants.runtime import TenantRuntime
from tenants.schemas import KeyCreate, TenantCreate
from tenants.settings import DEFAULT_LIMITS
from tenants.store import TenantStore
from tests.fake_engine import FakeEngine
from tests.gateway.harness import live_gateway, make_settings, wait_for

PROMPT = "{n}: company handbook section; always be accurate, cite the policy, stay polite. " * 4


async def test_startup_pins_most_recently_used_first_within_the_cap(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    store = TenantStore.open(gateway_database)
    now = datetime.now(UTC)
    ids = ["old", "newest", "middle", "never"]
    for n, tid in enumerate(ids):
        await store.create_tenant(
            TenantCreate(id=tid, name=tid, system_prompt=PROMPT.format(n=n)), actor="test"
        )
        await store.create_key(tid, KeyCreate(kind="server"), actor="test")
    used = {"old": now - timedelta(hours=3), "middle": now - timedelta(hours=1), "newest": now}
    async with store.sessions() as session, session.begin():
        for tid, at in used.items():
            await session.execute(
                update(ApiKey).where(ApiKey.tenant_id == tid).values(last_used_at=at)
            )
    await store.aclose()

    # 8 MiB KV = 128 blocks; a prompt here is 11 blocks; a 0.2 cap (25 blocks) holds two.
    settings = make_settings(gateway_database, tmp_path, KVGATE_PIN_CAP_FRACTION="0.2")
    async with live_gateway(settings, demo_model_dir) as gw:
        cap = int(0.2 * gw.state.engine.cache_stats().blocks_total)
        blocks = gw.state.pins.cache_info("newest")["pinned_blocks"]
        assert 2 * blocks <= cap < 3 * blocks  # the premise of this test
        states = {tid: gw.state.pins.cache_info(tid)["pin_state"] for tid in ids}
        assert states == {
            "newest": "pinned",
            "middle": "pinned",
            "old": "rejected",
            "never": "rejected",
        }
        gw.state.pins.check_integrity()


async def test_prompt_change_pins_new_then_unpins_old_after_in_flight(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    async with live_gateway(make_settings(gateway_database, tmp_path), demo_model_dir) as gw:
        t = await gw.create_tenant(
            "swap", system_prompt=PROMPT.format(n=1), limits={"max_output_tokens": 300}
        )
        v1 = await gw.wait_pinned(t.id)
        pins, engine = gw.state.pins, gw.state.engine
        base_pinned = engine.cache_stats().blocks_pinned
        client = gw.openai(t.key)
        msgs = [{"role": "user", "content": "go"}]
        stream = await client.chat.completions.create(
            model=gw.state.model_name, messages=msgs, max_tokens=300, stream=True
        )
        first = await anext(aiter(stream))
        assert first.choices
        await gw.admin("PUT", f"/tenants/{t.id}/system-prompt", {"text": PROMPT.format(n=2)})
        info = await gw.admin("GET", f"/tenants/{t.id}/cache")
        assert info["prompt_version"] == 2 and info["pin_state"] == "pinned"
        assert info["retiring_versions"] == [1]  # still serving the stream
        both = base_pinned + info["pinned_blocks"]
        await wait_for(lambda: engine.cache_stats().blocks_pinned == both)
        pins.check_integrity()

        async for _ in stream:
            pass
        await wait_for(lambda: not gw.state.pins.cache_info(t.id)["retiring_versions"])
        # cache_stats() is the engine thread's snapshot after its latest loop turn.
        expected = base_pinned - v1["pinned_blocks"] + info["pinned_blocks"]
        await wait_for(lambda: engine.cache_stats().blocks_pinned == expected)
        resp = await client.chat.completions.create(
            model=gw.state.model_name, messages=msgs, max_tokens=2
        )
        assert resp.usage.prompt_tokens_details.cached_tokens >= info["pinned_tokens"]
        pins.check_integrity()

        pinned_now = engine.cache_stats().blocks_pinned
        await gw.admin("PATCH", f"/tenants/{t.id}", {"status": "suspended"})
        after = pinned_now - info["pinned_blocks"]
        await wait_for(lambda: engine.cache_stats().blocks_pinned == after)
        assert gw.state.pins.current(t.id) is None


async def test_deleting_a_tenant_removes_its_prompt_snapshot(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    snapshots = tmp_path / "var" / "kv-snapshots"  # the default under KVGATE_VAR_DIR

    def files() -> set[str]:
        return {p.name for p in snapshots.glob("*.kvsnap")}

    async with live_gateway(make_settings(gateway_database, tmp_path), demo_model_dir) as gw:
        gone = await gw.create_tenant("gone", system_prompt=PROMPT.format(n=7))
        kept = await gw.create_tenant("kept", system_prompt=PROMPT.format(n=8))
        for t in (gone, kept):
            assert (await gw.wait_pinned(t.id))["pin_state"] == PINNED
        await wait_for(lambda: len(files()) == 2)  # written by the engine's background writer
        salts = {
            t.id: (await gw.state.store.get_tenant_runtime(t.id)).cache_salt for t in (gone, kept)
        }
        names = {tid: f"{namespace_digest(salt)}.kvsnap" for tid, salt in salts.items()}
        await gw.admin("PATCH", f"/tenants/{kept.id}", {"status": "suspended"})
        await gw.admin("DELETE", f"/tenants/{gone.id}")
        await wait_for(lambda: files() == {names[kept.id]})  # suspended: kept, deleted: removed


class Encoded(list[int]):
    """An encoding as the tokenizer's: its length, and its ids as a list."""

    @property
    def ids(self) -> list[int]:
        return list(self)


class CountingTokenizer:
    """ChatML-like template; counts how often text is tokenized."""

    def __init__(self) -> None:
        self.encoded: list[str] = []

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, str]],
        *,
        add_generation_prompt: bool = False,
        marked: bool = False,  # no control tokens here: the marked text is the same
    ) -> str:
        text = "".join(f"<{m['role']}>{m['content']}</>" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")

    def encode(self, text: str) -> list[int]:
        self.encoded.append(text)
        return [ord(c) for c in text]

    def encoding(self, text: str) -> Encoded:
        return Encoded(self.encode(text))

    def encode_marked(self, text: str, limit: int | None = None) -> list[int]:
        return [ord(c) for c in text]


class GatedPinEngine(FakeEngine):
    """``pin`` waits until ``release`` is set, like a prefill that takes a while (the pin
    calls of ``EngineClient``; the manager calls nothing else here)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.pinned: list[tuple[str, list[int]]] = []

    async def pin(self, owner: str, namespace: str, ids: Sequence[int]) -> PinTicket:
        await self.release.wait()
        self.pinned.append((namespace, list(ids)))
        return LocalPin(owner, PinHandle(0, namespace, (0,), len(ids)))

    async def unpin(self, ticket: PinTicket) -> None:
        pass


async def test_requests_while_a_version_is_pinned_share_one_prefix() -> None:
    tok, engine = CountingTokenizer(), GatedPinEngine()
    pins = PinManager(engine, tok, store=None)  # type: ignore[arg-type]
    rt = TenantRuntime("t1", "active", "salt-1", 1, "Be brief.", DEFAULT_LIMITS, True)
    entries = [pins.begin(rt)]
    await asyncio.sleep(0)  # the background activation is now waiting on the pin
    entries += [pins.begin(rt) for _ in range(4)]
    assert len(tok.encoded) == 1  # the system prompt was tokenized once, not per request
    assert all(e is entries[0] for e in entries) and entries[0].inflight == 5
    engine.release.set()
    await wait_for(lambda: pins.current("t1") is entries[0])
    assert entries[0].state == PINNED and engine.pinned == [("salt-1", list(entries[0].prefix.ids))]
    for e in entries:
        await pins.end(e, prompt_tokens=10, cached_tokens=5)
    assert pins.begin(rt) is entries[0] and len(tok.encoded) == 1
    pins.check_integrity()
    await pins.close()


async def test_a_new_version_is_built_off_the_loop_while_traffic_stays_on_the_current() -> None:
    """Activations build through ``offload`` (the gateway's tokenize pool: here a thread), and
    a request that sees a version this replica has not activated is served the current entry
    and starts that activation, once, instead of building the prefix itself."""
    tok, engine = CountingTokenizer(), GatedPinEngine()
    built_on: list[bool] = []

    async def offload(tenant: str, work: int, fn: Any) -> Any:
        def run() -> Any:
            built_on.append(threading.current_thread() is threading.main_thread())
            return fn()

        return await asyncio.to_thread(run)

    pins = PinManager(engine, tok, store=None, offload=offload)  # type: ignore[arg-type]
    v1 = TenantRuntime("t1", "active", "salt-1", 1, "Be brief.", DEFAULT_LIMITS, True)
    engine.release.set()
    first = await pins.activate(v1)
    v2 = dataclasses.replace(v1, prompt_version=2, prompt_text="Be very brief.")
    engine.release.clear()
    served = [pins.begin(v2) for _ in range(3)]
    assert all(e is first for e in served)  # the current version, no prefix built here
    await wait_for(lambda: len(built_on) == 2)  # v1's, then v2's: one activation started
    assert built_on == [False, False]  # both on the offload's thread
    engine.release.set()
    await wait_for(lambda: (cur := pins.current("t1")) is not None and cur.version == 2)
    assert len(tok.encoded) == 2
    served.append(pins.begin(v2))
    assert served[-1].version == 2
    for e in served:
        await pins.end(e, prompt_tokens=1, cached_tokens=0)
    pins.check_integrity()
    await pins.close()
