"""bench cluster's client load: a plan fixed by the seed, and the split of misses."""

from __future__ import annotations

import itertools

from bench.cluster_load import BLOCK, Sample, Seen, Workload, plan_requests


def test_the_plan_is_a_function_of_the_seed_and_turns_follow_each_other() -> None:
    w = Workload(duration_s=20.0)
    plan = plan_requests(w, 1)
    assert plan == plan_requests(w, 1) != plan_requests(w, 2)
    assert all(a.at < b.at for a, b in itertools.pairwise(plan))
    turns: dict[int, list[int]] = {}
    tenant: dict[int, int] = {}
    for p in plan:
        turns.setdefault(p.conv, []).append(p.turn)
        assert tenant.setdefault(p.conv, p.tenant) == p.tenant
    assert all(t == list(range(len(t))) and len(t) <= w.max_turns for t in turns.values())
    assert any(len(t) > 1 for t in turns.values())


def test_misses_split_into_first_sight_and_avoidable() -> None:
    seen = Seen()
    system = list(range(4 * BLOCK))
    first = [*system, 1, 2, 3]
    assert seen.longest(7, first) == 0
    seen.add(7, first)
    again = [*system, 4, 5, 6]
    assert seen.longest(7, again) == 4 * BLOCK and seen.longest(8, again) == 0
    s = Sample(0.0, len(again), seen=seen.longest(7, again), cached=0)  # sent elsewhere
    assert (s.first_sight, s.avoidable) == (3, 4 * BLOCK)
    pinned = Sample(0.0, len(first), seen=0, cached=4 * BLOCK)  # first sight, but pinned
    assert (pinned.first_sight, pinned.avoidable) == (3, 0)
