from __future__ import annotations

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenants.errors import InvalidField
from tenants.schemas import KeyCreate, LimitsIn, TenantCreate, TenantPatch, parse

ALPHABET = string.ascii_lowercase + string.digits + "-" + "A_ .\n"
SLUG_CHARS = set(string.ascii_lowercase + string.digits + "-")


def _is_slug(s: str) -> bool:
    return 2 <= len(s) <= 63 and set(s) <= SLUG_CHARS and s[0] != "-" and s[-1] != "-"


@given(st.text(alphabet=ALPHABET, min_size=0, max_size=70))
def test_tenant_id_rule(candidate: str) -> None:
    try:
        parse(TenantCreate, {"id": candidate, "name": "x"})
        accepted = True
    except InvalidField as err:
        assert err.param == "id"
        accepted = False
    assert accepted == _is_slug(candidate)


@pytest.mark.parametrize(
    ("model", "data", "param"),
    [
        (LimitsIn, {"rpm": 1, "extra": 2}, "extra"),
        (LimitsIn, {"max_output_tokens": 0}, "max_output_tokens"),
        (KeyCreate, {"kind": "server", "allowed_origins": ["https://a.b/path"]}, "allowed_origins"),
        (KeyCreate, {}, "kind"),
        (TenantCreate, [], None),
        # strict types: no coercion from strings, booleans or floats
        (LimitsIn, {"rpm": "5"}, "rpm"),
        (LimitsIn, {"tpm": True}, "tpm"),
        (LimitsIn, {"max_concurrency": 2.0}, "max_concurrency"),
        (TenantCreate, {"id": "ab", "name": "x", "allow_client_system": 1}, "allow_client_system"),
        (TenantCreate, {"id": "ab", "name": "x", "limits": {"rpm": "60"}}, "limits.rpm"),
        (TenantPatch, {"allow_client_system": "false"}, "allow_client_system"),
        (TenantPatch, {"name": 7}, "name"),
    ],
)
def test_parse_names_the_field(model: type, data: object, param: str | None) -> None:
    with pytest.raises(InvalidField) as err:
        parse(model, data)
    assert err.value.param == param


def test_parse_accepts_valid() -> None:
    key = parse(KeyCreate, {"kind": "widget", "allowed_origins": ["http://localhost:3000"]})
    assert key.allowed_origins == ["http://localhost:3000"]
    assert parse(LimitsIn, {}).model_dump() == {
        "rpm": None,
        "tpm": None,
        "max_concurrency": None,
        "max_output_tokens": None,
        "weight": None,
    }
