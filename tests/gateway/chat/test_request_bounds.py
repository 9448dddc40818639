"""The bounds of one chat request through a live gateway (gateway/chat/bounds.py): logit bias
entries and keys, stop string lengths, seeds, the logprobs a non-streamed answer may hold, and
``n`` as n engine requests (n concurrency slots, the TPM reservation, widget traffic)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gateway.chat.bounds import MAX_LOGIT_BIAS, MAX_LOGPROB_ENTRIES, MAX_STOP_CHARS
from tests.gateway.harness import (
    ADMIN_TOKEN,
    LiveGateway,
    TenantHandle,
    gateway_on_fresh_database,
    wait_for,
)
from tests.widget.helpers import widget_chat, widget_tenant

pytestmark = pytest.mark.asyncio(loop_scope="module")

SITE = "https://shop.example"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(
    template_database: str, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[LiveGateway]:
    var_dir = tmp_path_factory.mktemp("bounds")
    async with gateway_on_fresh_database(template_database, demo_model_dir, var_dir) as live:
        yield live


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def tenant(gw: LiveGateway) -> TenantHandle:
    return await gw.create_tenant("bounds", limits={"max_output_tokens": 2000})


def body(gw: LiveGateway, **extra: Any) -> dict[str, Any]:
    return {
        "model": gw.state.model_name,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        **extra,
    }


async def chat(gw: LiveGateway, key: str, payload: Any) -> tuple[int, dict[str, str], Any]:
    """(status, headers, JSON body); ``payload`` is a dict, or raw JSON text."""
    data = payload if isinstance(payload, str) else json.dumps(payload)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    url = f"{gw.base_url}/v1/chat/completions"
    async with gw.http.post(url, data=data, headers=headers) as r:
        return r.status, dict(r.headers), await r.json()


def refused(answer: tuple[int, dict[str, str], Any], param: str) -> dict[str, Any]:
    status, _, data = answer
    assert status == 400, (status, data)
    error = data["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    return error


# -- logit_bias ---------------------------------------------------------------------------------


async def test_logit_bias_is_capped_in_entries(gw: LiveGateway, tenant: TenantHandle) -> None:
    full = {str(i): 0.5 for i in range(MAX_LOGIT_BIAS)}
    assert (await chat(gw, tenant.key, body(gw, logit_bias=full)))[0] == 200
    over = {**full, str(MAX_LOGIT_BIAS): 0.5}
    error = refused(await chat(gw, tenant.key, body(gw, logit_bias=over)), "logit_bias")
    assert f"at most {MAX_LOGIT_BIAS} entries" in error["message"]


async def test_logit_bias_keys_beyond_the_int_digit_limit_are_a_400(
    gw: LiveGateway, tenant: TenantHandle
) -> None:
    # Python's int() refuses strings of more than 4300 digits with a ValueError.
    for key in ("9" * 5000, "1" * 4301, "9" * 11):
        raw = json.dumps(body(gw)).removesuffix("}") + f', "logit_bias": {{"{key}": 1}}}}'
        error = refused(await chat(gw, tenant.key, raw), "logit_bias")
        assert len(error["message"]) < 200  # the key is not echoed in full
    # Leading zeros do not make an id long: "000...05" is token 5.
    raw = json.dumps(body(gw)).removesuffix("}") + f', "logit_bias": {{"{"0" * 5000}5": 1}}}}'
    assert (await chat(gw, tenant.key, raw))[0] == 200


async def test_seed_is_a_64_bit_integer(gw: LiveGateway, tenant: TenantHandle) -> None:
    assert (await chat(gw, tenant.key, body(gw, seed=2**63 - 1)))[0] == 200
    assert (await chat(gw, tenant.key, body(gw, seed=-(2**63))))[0] == 200
    refused(await chat(gw, tenant.key, body(gw, seed=2**63)), "seed")
    refused(await chat(gw, tenant.key, body(gw, seed=int("9" * 4000))), "seed")


# -- stop ---------------------------------------------------------------------------------------


async def test_stop_sequences_are_capped_in_length(gw: LiveGateway, tenant: TenantHandle) -> None:
    longest = "z" * MAX_STOP_CHARS
    assert (await chat(gw, tenant.key, body(gw, stop=[longest, "q"])))[0] == 200
    assert (await chat(gw, tenant.key, body(gw, stop=longest)))[0] == 200
    for stop in (longest + "z", ["q", "x" * 100_000]):
        error = refused(await chat(gw, tenant.key, body(gw, stop=stop)), "stop")
        assert f"at most {MAX_STOP_CHARS} characters" in error["message"]


# -- logprobs -----------------------------------------------------------------------------------


async def test_non_streamed_logprobs_are_bounded(gw: LiveGateway, tenant: TenantHandle) -> None:
    # 8 x 800 x 21 = 134,400 entries: more than the bound allows non-streamed.
    big = body(gw, n=8, max_tokens=800, logprobs=True, top_logprobs=20)
    assert MAX_LOGPROB_ENTRIES < 8 * 800 * 21
    error = refused(await chat(gw, tenant.key, big), "logprobs")
    assert error["code"] == "logprobs_too_large"
    for name in ("n (8)", "max_tokens (800)", "top_logprobs (20)", "stream"):
        assert name in error["message"]
    # Without logprobs the same answer holds no per-token entries: no such bound.
    plain = {k: v for k, v in big.items() if k not in ("logprobs", "top_logprobs")}
    assert (await chat(gw, tenant.key, {**plain, "max_tokens": 2}))[0] == 200
    # Within the bound: served, one entry and 20 alternatives per token.
    status, _, data = await chat(gw, tenant.key, {**big, "max_tokens": 2})
    assert status == 200 and len(data["choices"]) == 8
    assert all(len(c["logprobs"]["content"][0]["top_logprobs"]) == 20 for c in data["choices"])


async def test_streamed_logprobs_are_not_bounded_and_not_held(
    gw: LiveGateway, tenant: TenantHandle
) -> None:
    """A stream sends each entry once and keeps none of them: the bound does not apply."""
    client = gw.openai(tenant.key)
    stream = await client.chat.completions.create(
        **body(gw, n=8, max_tokens=800, logprobs=True, top_logprobs=20, stream=True)
    )
    entries = 0
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].logprobs:
            entries += len(chunk.choices[0].logprobs.content or [])
        if entries >= 16:
            break
    await stream.close()
    assert entries >= 16
    await wait_for(lambda: gw.state.engine.cache_stats().blocks_in_use == 0, timeout=5.0)


# -- n ------------------------------------------------------------------------------------------


async def test_n_choices_take_n_concurrency_slots(gw: LiveGateway) -> None:
    t = await gw.create_tenant("slots", limits={"max_concurrency": 4, "max_output_tokens": 1500})
    client = gw.openai(t.key)
    stream = await client.chat.completions.create(
        **body(gw, n=3, max_tokens=1500, temperature=0, stream=True)
    )
    got = 0
    async for _chunk in stream:
        got += 1
        if got == 6:
            break
    assert gw.state.limiter.active_leases(t.id) == 3
    status, headers, data = await chat(gw, t.key, body(gw, n=2))
    assert status == 429 and data["error"]["code"] == "rate_limit_exceeded", data
    assert "concurrent requests" in data["error"]["message"]
    assert int(headers["Retry-After"]) >= 1
    assert (await chat(gw, t.key, body(gw, n=1)))[0] == 200  # the fourth slot
    await stream.close()
    await wait_for(lambda: gw.state.limiter.active_leases(t.id) == 0, timeout=5.0)
    gw.state.limiter.check_integrity()
    assert (await chat(gw, t.key, body(gw, n=4)))[0] == 200


async def test_n_above_the_concurrency_limit_is_a_400_not_a_wait(gw: LiveGateway) -> None:
    t = await gw.create_tenant("wide", limits={"max_concurrency": 2})
    error = refused(await chat(gw, t.key, body(gw, n=3)), "n")
    assert error["code"] == "too_many_choices"
    assert "at most 2 concurrent requests" in error["message"]
    assert gw.state.limiter.active_leases(t.id) == 0
    assert (await chat(gw, t.key, body(gw, n=2)))[0] == 200


async def test_tpm_reserves_the_prompt_once_and_max_tokens_per_choice(gw: LiveGateway) -> None:
    t = await gw.create_tenant("tpm-n", limits={"tpm": 100_000, "max_output_tokens": 100})
    status, headers, data = await chat(gw, t.key, body(gw, n=4, max_tokens=50, stop=["zzz"]))
    assert status == 200
    reserved = data["usage"]["prompt_tokens"] + 4 * 50
    remaining = int(headers["x-ratelimit-remaining-tokens"])  # at admission
    assert 100_000 - reserved - 1 <= remaining <= 100_000 - reserved + 5  # (+ refill)
    assert data["usage"]["completion_tokens"] <= 200


# -- n of widget traffic ------------------------------------------------------------------------


async def test_widget_traffic_gets_one_choice_unless_the_tenant_allows_more(
    gw: LiveGateway,
) -> None:
    t = await widget_tenant(gw, "wn", [SITE])
    settings = await gw.admin("GET", f"/tenants/{t.id}/widget")
    assert settings["max_choices"] == 1  # the default
    assert (await widget_chat(gw, t.widget_key, SITE, body(gw)))[0] == 200
    status, _, data = await widget_chat(gw, t.widget_key, SITE, body(gw, n=2))
    assert status == 400 and data["error"]["param"] == "n", data
    assert data["error"]["code"] == "too_many_choices"
    assert (await chat(gw, t.server_key, body(gw, n=2)))[0] == 200  # server keys: up to 128

    out = await gw.admin("PUT", f"/tenants/{t.id}/widget", {"max_choices": 3})
    assert out["max_choices"] == 3
    assert (await widget_chat(gw, t.widget_key, SITE, body(gw, n=2)))[0] == 200
    # n=3 is allowed by the tenant, but the visitor limit (2 concurrent by default) never
    # fits 3 engine requests at once: a 400 naming the visitor scope, not a 429 to retry.
    status, _, data = await widget_chat(gw, t.widget_key, SITE, body(gw, n=3))
    assert status == 400 and data["error"]["param"] == "n", data
    assert "visitor" in data["error"]["message"]
    await gw.admin(
        "PUT",
        f"/tenants/{t.id}/widget",
        {"max_choices": 3, "visitor_limits": {"max_concurrency": 3}},
    )
    assert (await widget_chat(gw, t.widget_key, SITE, body(gw, n=3)))[0] == 200
    status, _, data = await widget_chat(gw, t.widget_key, SITE, body(gw, n=4))
    assert status == 400 and "at most 3" in data["error"]["message"]


async def test_widget_max_choices_is_validated_and_audited(gw: LiveGateway) -> None:
    t = await widget_tenant(gw, "wv", [SITE])
    url = f"{gw.base_url}/admin/v1/tenants/{t.id}/widget"
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    for bad in (0, 129, "2", True):
        async with gw.http.put(url, json={"max_choices": bad}, headers=headers) as r:
            assert r.status == 422, bad
            assert (await r.json())["error"]["param"] == "max_choices"
    await gw.admin("PUT", f"/tenants/{t.id}/widget", {"max_choices": 5})
    audit = await gw.admin("GET", f"/audit?tenant={t.id}")
    changes = [e for e in audit["data"] if e["action"] == "widget.set"]
    assert changes and changes[0]["details"]["after"]["widget_max_choices"] == 5
    doc = await (await gw.http.get(f"{gw.base_url}/openapi.json")).json()
    schema = doc["components"]["schemas"]["WidgetSettingsIn"]["properties"]["max_choices"]
    assert schema["minimum"] == 1 and schema["maximum"] == 128
