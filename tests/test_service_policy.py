"""A test without its PostgreSQL / Redis skips on a developer machine and fails in CI."""

from __future__ import annotations

import pytest

from tests.conftest import service_unavailable

DOWN = ConnectionRefusedError(111, "Connection refused")


@pytest.mark.parametrize("ci", ["true", "TRUE", "1"])
def test_ci_turns_a_missing_service_into_a_failure(
    monkeypatch: pytest.MonkeyPatch, ci: str
) -> None:
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception, match="Redis not reachable"):
        service_unavailable("Redis", DOWN)


@pytest.mark.parametrize("ci", [None, "", "false", "0"])
def test_outside_ci_a_missing_service_skips(
    monkeypatch: pytest.MonkeyPatch, ci: str | None
) -> None:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception, match="PostgreSQL not reachable"):
        service_unavailable("PostgreSQL", DOWN)
