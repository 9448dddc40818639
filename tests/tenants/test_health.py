"""DbHealth: down after a failure; one trial per retry interval while down; up on success."""

from __future__ import annotations

from tenants.errors import StoreUnavailable
from tenants.health import DbHealth


def test_fail_fast_while_down_with_one_trial_per_interval() -> None:
    now = [0.0]
    health = DbHealth(retry_s=1.0, clock=lambda: now[0])
    assert health.up and health.admit() and health.admit()
    try:
        raise StoreUnavailable("x") from TimeoutError()
    except StoreUnavailable as exc:
        health.failed(exc)
    health.check_integrity()
    snap = health.snapshot()
    assert not snap.up and snap.down_for_s == 0.0 and snap.last_error == "TimeoutError"
    assert not health.admit()  # within the retry interval: fail at once
    now[0] = 1.0
    assert health.admit()  # the trial
    assert not health.admit()  # only one per interval
    now[0] = 1.5
    health.failed(StoreUnavailable("still"))
    assert health.snapshot().down_for_s == 1.5  # the outage started at the first failure
    assert not health.admit()
    now[0] = 2.5
    assert health.admit()
    health.succeeded()
    health.check_integrity()
    assert health.up and health.admit() and health.snapshot().down_for_s is None


def test_zero_retry_interval_tracks_but_never_fails_fast() -> None:
    health = DbHealth(retry_s=0.0)
    health.failed(StoreUnavailable("x"))
    assert not health.up and health.admit() and health.admit()
