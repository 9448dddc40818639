"""Session tokens: round trip, expiry, tampering, wrong secret, garbage."""

from __future__ import annotations

import pytest

from gateway.access import session_tokens as tokens
from gateway.access.session_tokens import SessionClaims, SessionTokenError

CLAIMS = SessionClaims("acme", "key_1", "https://shop.example", "user-7", 1_000)
SECRET = "s" * 64


def test_round_trip_and_tenant_peek() -> None:
    token = tokens.sign(CLAIMS, SECRET)
    assert tokens.is_session_token(token)
    assert tokens.peek_tenant(token) == "acme"
    assert tokens.verify(token, SECRET, now=999.0) == CLAIMS


def test_expiry_is_enforced() -> None:
    token = tokens.sign(CLAIMS, SECRET)
    with pytest.raises(SessionTokenError) as exc:
        tokens.verify(token, SECRET, now=1_000.0)
    assert exc.value.expired


@pytest.mark.parametrize("secret", ["t" * 64, None])
def test_wrong_or_missing_secret(secret: str | None) -> None:
    token = tokens.sign(CLAIMS, SECRET)
    with pytest.raises(SessionTokenError) as exc:
        tokens.verify(token, secret, now=0.0)
    assert not exc.value.expired


def test_changed_claims_do_not_verify() -> None:
    token = tokens.sign(CLAIMS, SECRET)
    forged = tokens.sign(
        SessionClaims("acme", "key_1", "https://evil.example", "user-7", 1_000), "x"
    )
    payload, mac = token.split(".")
    forged_payload = forged.split(".")[0]
    for bad in (f"{forged_payload}.{mac}", f"{payload}.{mac[:-2]}", f"{payload}.{mac}é"):
        with pytest.raises(SessionTokenError):
            tokens.verify(bad, SECRET, now=0.0)


def test_claimed_tenant_must_look_like_a_tenant_id() -> None:
    for tenant in ("a\x00b", "UPPER", "", "x" * 64):
        token = tokens.sign(SessionClaims(tenant, "k", "https://a.example", "u", 9), SECRET)
        with pytest.raises(SessionTokenError):
            tokens.peek_tenant(token)


@pytest.mark.parametrize(
    "garbage", ["kvws_", "kvws_.", "kvws_abc", "kvws_!!!.x", "kvws_bnVsbA.x", "kvg_x", "kvws_W10.x"]
)
def test_garbage_is_a_token_error(garbage: str) -> None:
    with pytest.raises(SessionTokenError):
        tokens.peek_tenant(garbage)
        tokens.verify(garbage, SECRET, now=0.0)
