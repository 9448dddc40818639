"""Deleting a tenant through the gateway removes its prompt snapshots on every worker: at once on
the workers that answer, and on one that was down as soon as it is taken in again."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from engine.runtime.snapshot import namespace_digest
from gateway.cluster.local import LocalWorker
from tests.cluster.workers import TOKEN, stop_all, worker_env
from tests.gateway.harness import (
    create_database,
    drop_database,
    live_gateway,
    make_settings,
    pg_url,
    wait_for,
)

PROMPT = "You are the support assistant of a rocket shop; cite the policy, stay polite. " * 4


def _start(model_dir: Path, worker_id: str, snapshots: Path) -> LocalWorker:
    env = {**worker_env(), "KVGATE_KV_SNAPSHOT_DIR": str(snapshots)}
    return LocalWorker.start(str(model_dir), 120, worker_id=worker_id, token=TOKEN, env=env)


async def test_deleting_a_tenant_removes_its_snapshots_on_every_worker(
    demo_model_dir: Path, tmp_path: Path
) -> None:
    from tenants.migrate import upgrade_to_head

    dirs = {w: tmp_path / f"snapshots-{w}" for w in ("w0", "w1")}
    workers = list(
        await asyncio.gather(
            *(asyncio.to_thread(_start, demo_model_dir, w, d) for w, d in dirs.items())
        )
    )
    name = await create_database()
    try:
        await upgrade_to_head(pg_url(name))
        settings = make_settings(
            pg_url(name),
            tmp_path,
            KVGATE_WORKERS=",".join(w.url for w in workers),
            KVGATE_WORKER_TOKEN=TOKEN,
            KVGATE_WORKER_HEALTH_S="0.3",
        )
        async with live_gateway(settings, tmp_path / "no-model-needed") as gw:
            await _delete_with_one_worker_down(gw, workers, dirs, demo_model_dir)
    finally:
        await stop_all(workers)
        await drop_database(name)


async def _delete_with_one_worker_down(
    gw, workers: list[LocalWorker], dirs: dict[str, Path], model_dir: Path
) -> None:
    gone = await gw.create_tenant("gone", system_prompt=PROMPT)
    kept = await gw.create_tenant("kept", system_prompt=PROMPT + "Second tenant.")
    for t in (gone, kept):
        assert (await gw.wait_pinned(t.id))["pin_state"] == "pinned"
    store = gw.state.store
    file, kept_file = [
        f"{namespace_digest((await store.get_tenant_runtime(t.id)).cache_salt)}.kvsnap"
        for t in (gone, kept)
    ]

    def holders(name: str = file) -> set[str]:
        return {w for w, d in dirs.items() if (d / name).exists()}

    await wait_for(lambda: holders() and holders(kept_file), timeout=30.0)  # written by then
    for w, d in dirs.items():  # a snapshot on both (as after a re-placement)
        if w not in holders():
            shutil.copy(next(dirs[h] for h in holders()) / file, d / file)
    kept_on = holders(kept_file)

    down = workers.pop()  # w1 goes away before the deletion
    await down.stop()
    await wait_for(lambda: "w1" not in gw.state.engine.healthy(), timeout=30.0)
    await gw.admin("DELETE", f"/tenants/{gone.id}")
    await wait_for(lambda: holders() == {"w1"}, timeout=30.0)  # removed where it could be

    back = await asyncio.to_thread(_start, model_dir, "w1", dirs["w1"])
    workers.append(back)
    gw.state.engine.set_endpoints([w.url for w in workers])
    await wait_for(lambda: not holders(), timeout=60.0)  # ... and on w1 once it is back
    assert holders(kept_file) >= kept_on  # the other tenant's snapshots stay
    gw.state.engine.check_integrity()
