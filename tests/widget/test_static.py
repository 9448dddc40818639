"""What needs no server: the script's text, the demo page's default."""

from __future__ import annotations

from gateway.settings import Settings
from gateway.widget.views import SCRIPT_PATH


def test_script_never_parses_markup() -> None:
    """Model and server text go in as text nodes; nothing in the widget parses HTML or code."""
    source = SCRIPT_PATH.read_text()
    for sink in (
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
        "Function(",
    ):
        assert sink not in source.replace("no innerHTML anywhere", ""), sink


def test_demo_default_is_on_only_in_the_embedded_default() -> None:
    assert Settings.from_env({}).widget.demo
    assert not Settings.from_env({"KVGATE_DATABASE_URL": "postgresql+asyncpg://h/db"}).widget.demo
    on = {"KVGATE_DATABASE_URL": "postgresql+asyncpg://h/db", "KVGATE_WIDGET_DEMO": "true"}
    assert Settings.from_env(on).widget.demo
    assert not Settings.from_env({"KVGATE_WIDGET_DEMO": "false"}).widget.demo
