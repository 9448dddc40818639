"""Every ``^...$`` validation pattern refuses a trailing newline (Python's ``$`` matches before
one, so validation uses ``fullmatch``): tenant ids, origins, accents, keys, admin token hashes,
the tenant a session token claims. A source scan keeps new anchored patterns on ``fullmatch``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from gateway.access import session_tokens as tokens
from gateway.widget.views import SessionIn
from tenants.errors import ConfigError, InvalidField
from tenants.keys import generate_key, key_prefix
from tenants.schemas import KeyCreate, TenantCreate, WidgetSettingsIn, parse
from tenants.settings import TenantStoreSettings

ROOT = Path(__file__).resolve().parents[2]
SITE = "https://a.example"
NL_SITE = SITE + "\n"


@pytest.mark.parametrize(
    ("model", "good", "field", "bad"),
    [
        (TenantCreate, {"id": "acme", "name": "Acme"}, "id", "acme\n"),
        (KeyCreate, {"kind": "widget", "allowed_origins": [SITE]}, "allowed_origins", [NL_SITE]),
        (WidgetSettingsIn, {"accent": "#0b5fff"}, "accent", "#0b5fff\n"),
        (SessionIn, {"end_user_id": "u", "origin": SITE}, "origin", NL_SITE),
    ],
)
def test_admin_and_widget_fields_refuse_a_trailing_newline(
    model: type[BaseModel], good: dict[str, Any], field: str, bad: Any
) -> None:
    parse(model, good)  # the value itself is fine
    with pytest.raises(InvalidField) as exc:
        parse(model, {**good, field: bad})
    assert exc.value.param == field


def test_a_key_with_a_trailing_newline_is_malformed() -> None:
    key = generate_key().key
    assert key_prefix(key) is not None
    assert key_prefix(key + "\n") is None


def test_admin_token_hash_with_a_trailing_newline_is_refused() -> None:
    sha = "a" * 64
    TenantStoreSettings(admin_token_sha256=sha)
    with pytest.raises(ConfigError):
        TenantStoreSettings(admin_token_sha256=sha + "\n")


def test_session_token_tenant_with_a_trailing_newline_is_refused() -> None:
    claims = tokens.SessionClaims("acme\n", "key_1", SITE, "u", 9)
    with pytest.raises(tokens.SessionTokenError):
        tokens.peek_tenant(tokens.sign(claims, "s" * 64))


def test_pydantic_patterns_end_at_the_end_of_the_text() -> None:
    """pydantic-core's default regex engine (Rust ``regex``) reads ``$`` as the end of the
    text, so a ``Field(pattern=...)`` would be safe too; the project's validators do not rely on
    it (they call ``fullmatch``), and no model switches to the ``python-re`` engine."""

    class M(BaseModel):
        x: str = Field(pattern=r"^[a-z]+$")

    with pytest.raises(ValueError):
        M(x="abc\n")
    sources = [p.read_text() for d in ("gateway", "tenants") for p in (ROOT / d).rglob("*.py")]
    assert not any("python-re" in s for s in sources)


_COMPILED = re.compile(r"^(\w+)\s*=\s*re\.compile\(r?\"\^.*\$\"\)", re.M)


def test_anchored_patterns_are_only_used_with_fullmatch() -> None:
    """A tripwire: ``NAME.match(`` / ``NAME.search(`` on a module's ``^...$`` pattern."""
    files = [p for d in ("gateway", "tenants", "engine") for p in (ROOT / d).rglob("*.py")]
    names = {m.group(1) for p in files for m in _COMPILED.finditer(p.read_text())}
    assert {"TENANT_ID_RE", "ORIGIN_RE", "KEY_RE"} <= names
    for path in files:
        for name in names:
            found = re.search(rf"\b{name}\.(match|search)\(", path.read_text())
            assert found is None, f"{path.relative_to(ROOT)}: {name}.{found and found.group(1)}"
