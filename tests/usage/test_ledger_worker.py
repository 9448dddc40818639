"""The ledger names the engine worker that served each request: a gateway in front of two worker
processes (the cluster path) records, per worker, as many requests as its router sent there; an
in-process engine records none (tests/usage/test_ledger_totals.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from gateway.cluster.engine import ClusterEngine
from gateway.cluster.local import LocalWorker
from gateway.usage.ledger import LEDGER
from tests.cluster.workers import TOKEN, start_workers, stop_workers
from tests.gateway.harness import live_gateway, make_settings
from tests.usage.helpers import wait_records


@pytest.fixture(scope="module")
def workers(demo_model_dir: Path) -> Iterator[list[LocalWorker]]:
    started = start_workers(demo_model_dir, ["lw0", "lw1"])
    yield started
    stop_workers(started)


async def test_records_name_the_worker_that_served(
    workers: list[LocalWorker], gateway_database: str, tmp_path: Path
) -> None:
    settings = make_settings(
        gateway_database,
        tmp_path,
        KVGATE_WORKERS=",".join(w.url for w in workers),
        KVGATE_WORKER_TOKEN=TOKEN,
        KVGATE_USAGE_FLUSH_S="0.05",
    )
    async with live_gateway(settings, tmp_path / "no-model-needed") as gw:
        eng = gw.state.engine
        assert isinstance(eng, ClusterEngine)
        tenants = [await gw.create_tenant(f"wk{i}", system_prompt=f"Desk {i}.") for i in range(4)]
        for m in eng.members.values():
            m.routed.clear()  # from here on: the chats below only
        sent = 0
        for t in tenants:
            client = gw.openai(t.key)
            for j in range(3):
                msgs = [{"role": "user", "content": f"question {j}"}]
                await client.chat.completions.create(
                    model=gw.state.model_name, messages=msgs, max_tokens=3
                )
                sent += 1
        for t in tenants:
            await wait_records(gateway_database, t.id, 3)
        async with gw.app[LEDGER].engine.connect() as conn:
            rows = (await conn.execute(text("SELECT worker, outcome FROM usage_records"))).all()
        routed = {m.worker_id: sum(m.routed.values()) for m in eng.members.values()}
    assert len(rows) == sent and all(r.outcome == "answered" for r in rows)
    recorded = Counter(r.worker for r in rows)
    assert None not in recorded, recorded
    assert set(routed) == {"lw0", "lw1"}
    assert dict(recorded) == {w: n for w, n in routed.items() if n}, (recorded, routed)
