"""``Scheduler.check_integrity``: queues, request states, block tables and fair-share counts
checked against each other and against the prefix cache (tests call it after every step)."""

from __future__ import annotations

from collections import deque
from typing import Protocol

from engine.config import EngineConfig
from engine.core.fairness import FairShare
from engine.core.kv import PrefixCache
from engine.core.request import Request, RequestStatus


class Scheduler(Protocol):
    """What the checks read of engine/core/scheduler.py's Scheduler (no import back)."""

    config: EngineConfig
    cache: PrefixCache
    block_size: int
    waiting: deque[Request]
    running: list[Request]
    requests: dict[str, Request]
    fair: FairShare


def check_scheduler(self: Scheduler) -> None:
    """Raise AssertionError if queues, request states or block tables are inconsistent."""
    waiting_ids = [r.request_id for r in self.waiting]
    running_ids = [r.request_id for r in self.running]
    assert len(set(waiting_ids)) == len(waiting_ids), "duplicate in waiting"
    assert len(set(running_ids)) == len(running_ids), "duplicate in running"
    both = set(waiting_ids) & set(running_ids)
    assert not both, f"requests both waiting and running: {both}"
    assert set(waiting_ids) | set(running_ids) == set(self.requests), "queues != requests"
    assert len(self.running) <= self.config.max_num_seqs, "more running than max_num_seqs"
    seqs = [r.admit_seq for r in self.running]
    assert seqs == sorted(seqs), "running not in admission order"
    for req in self.waiting:
        assert req.status is RequestStatus.WAITING, f"{req.request_id} in waiting is {req.status}"
        assert req.num_computed == 0 and not req.block_table, f"{req.request_id} holds state"
    for req in self.running:
        _check_running(self, req)
    # The cache tracks exactly the running requests (waiting and finished ones hold nothing).
    cached_ids = set(self.cache.requests)
    assert cached_ids == set(running_ids), (
        f"cache holds {sorted(cached_ids - set(running_ids))} not running; "
        f"running without cache state: {sorted(set(running_ids) - cached_ids)}"
    )
    self.fair.check_integrity(
        (r.tenant, r.status is RequestStatus.WAITING) for r in self.requests.values()
    )
    self.cache.check_integrity()


def _check_running(self: Scheduler, req: Request) -> None:
    rid = req.request_id
    assert req.status is RequestStatus.RUNNING, f"{rid} in running is {req.status}"
    assert 0 <= req.num_computed < req.num_tokens, f"{rid}: nothing left to compute"
    # The table covers every token known at the last allocation; a token sampled since then
    # is covered at the next schedule().
    assert len(req.block_table) * self.block_size >= req.num_tokens - 1, f"{rid}: short table"
    assert len(req.block_table) * self.block_size >= req.num_computed
    state = self.cache.requests.get(rid)
    assert state is not None, f"{rid}: running but unknown to the cache"
    cache_table = tuple(state.block_ids)
    assert cache_table == tuple(req.block_table), (
        f"{rid}: block table {req.block_table} != cache's {tuple(cache_table)}"
    )
