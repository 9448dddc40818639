"""SnapshotForgets: what a worker is owed survives its failures, follows it from url to id, and
is bounded."""

from __future__ import annotations

from typing import Any

from engine.remote.client import WorkerInfo, WorkerUnavailable
from gateway.cluster.forget import SnapshotForgets
from gateway.cluster.members import Member


class FakeClient:
    def __init__(self) -> None:
        self.up = True
        self.removed: list[str] = []

    async def forget(self, namespace: str) -> bool:
        if not self.up:
            raise WorkerUnavailable("refused", refused=True)
        self.removed.append(namespace)
        return True


def member(url: str, worker_id: str | None = None) -> Any:
    m = Member(url, FakeClient())  # type: ignore[arg-type]
    if worker_id is not None:
        m.info = WorkerInfo(worker_id, "boot", 16, 1024, 128, 64)
        m.healthy = True
    return m


async def test_owed_removals_wait_for_the_worker_and_follow_it_from_url_to_id() -> None:
    forgets = SnapshotForgets()
    known, unknown = member("http://a", "wa"), member("http://b")
    forgets.owe([known, unknown], "ns1")
    known.client.up = False
    assert await forgets.pay(known) is False and forgets.owes(known)  # kept while it is down
    forgets.owe([known], "ns2")
    known.client.up = True
    assert await forgets.pay(known) is True
    assert known.client.removed == ["ns1", "ns2"] and not forgets.owes(known)
    unknown.info = WorkerInfo("wb", "boot", 16, 1024, 128, 64)  # its id learned when taken in
    assert forgets.owes(unknown)
    assert await forgets.pay(unknown) is True and unknown.client.removed == ["ns1"]
    assert not forgets.owes(unknown)
    forgets.check_integrity()


async def test_what_is_owed_is_bounded_oldest_first() -> None:
    forgets = SnapshotForgets(cap=3)
    m = member("http://a", "wa")
    for i in range(5):
        forgets.owe([m], f"ns{i}")
    forgets.check_integrity()
    await forgets.pay(m)
    assert m.client.removed == ["ns2", "ns3", "ns4"]
