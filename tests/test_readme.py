"""The README's configuration table is the one the settings declare (it cannot drift)."""

from __future__ import annotations

from pathlib import Path

from gateway.settings import configuration_table

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_lists_every_setting_as_declared() -> None:
    table = configuration_table().strip()
    assert table in README.read_text(), (
        "README.md's configuration table differs from gateway.settings.VARIABLES; paste "
        "`python -c 'from gateway.settings import configuration_table as t; print(t())'`"
    )
