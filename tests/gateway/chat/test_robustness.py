"""Property: nothing a client can send makes the gateway answer 5xx.

Arbitrary JSON values, wrong types in every field, junk nesting, huge numbers, NUL bytes and lone
surrogates, non-UTF-8 bytes and wrong content types are posted to the chat endpoint (valid tenant
key) and to every admin mutation route; arbitrary path and query values go to every admin route;
bodies in every Content-Encoding (right, wrong, unsupported, unknown) and header lines with control
bytes around the key go to both. Every answer is below 500 and every error body is OpenAI-shaped;
no answer and no log line quotes a key. The gateway is served as ``kvgate serve`` serves it, on
the HTTP layer of gateway/http.py. Examples are bounded and derandomized so the run is fast and
reproducible.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
import pytest_asyncio
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from yarl import URL

from gateway.app import create_app
from gateway.context import STATE
from gateway.http import make_runner
from tests.gateway.harness import (
    ADMIN_TOKEN,
    LiveGateway,
    TenantHandle,
    create_database,
    drop_database,
    make_settings,
    pg_url,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

FUZZ = settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# -- strategies ---------------------------------------------------------------------------------
nasty_text = st.one_of(
    st.text(max_size=24),
    st.sampled_from(
        ["", " ", "NaN", "Infinity", "-inf", "1e999", "\x00", "a\x00b", "\ud800", "\udfff x"]
    ),
)
nasty_numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 2**31, 2**63, -(2**63) - 1, 10**30]),
    st.floats(allow_nan=False, allow_infinity=False),
)
scalars = st.one_of(st.none(), st.booleans(), nasty_numbers, nasty_text)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(nasty_text, inner, max_size=4)
    ),
    max_leaves=12,
)


def fields(valid: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects of the known fields, each well-typed or junk (any JSON value); some with extras.

    Well-typed values are drawn more often than junk, so bodies that pass validation (and reach
    the store or the engine with edge values) are common, not rare."""
    choice = {name: st.one_of(strat, strat, json_values) for name, strat in valid.items()}
    extras = st.one_of(
        st.just({}), st.just({}), st.dictionaries(nasty_text, json_values, max_size=2)
    )
    return st.tuples(st.fixed_dictionaries({}, optional=choice), extras).map(
        lambda pair: {**pair[1], **pair[0]}
    )


message = fields(
    {
        "role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]),
        "content": st.one_of(
            nasty_text,
            st.lists(fields({"type": st.just("text"), "text": nasty_text}), max_size=3),
        ),
        "name": nasty_text,
    }
)


def chat_body(model: str) -> st.SearchStrategy[dict[str, Any]]:
    return fields(
        {
            "model": st.one_of(st.just(model), nasty_text),
            "messages": st.lists(message, max_size=3),
            "max_tokens": nasty_numbers,
            "max_completion_tokens": nasty_numbers,
            "temperature": nasty_numbers,
            "top_p": nasty_numbers,
            "stop": st.one_of(nasty_text, st.lists(nasty_text, max_size=5)),
            "seed": nasty_numbers,
            "stream": st.booleans(),
            "stream_options": fields({"include_usage": st.booleans()}),
            "n": nasty_numbers,
            "user": nasty_text,
        }
    )


limits = fields(
    {
        "rpm": nasty_numbers,
        "tpm": nasty_numbers,
        "max_concurrency": nasty_numbers,
        "max_output_tokens": nasty_numbers,
    }
)
tenant_ids = st.one_of(st.from_regex(r"\Afz-[a-z0-9]{1,8}\Z"), nasty_text)
tenant_create = fields(
    {
        "id": tenant_ids,
        "name": nasty_text,
        "system_prompt": nasty_text,
        "limits": limits,
        "allow_client_system": st.booleans(),
    }
)
tenant_patch = fields(
    {
        "name": nasty_text,
        "status": st.sampled_from(["active", "suspended", "deleted"]),
        "allow_client_system": st.booleans(),
    }
)
prompt_set = fields({"text": nasty_text})
key_create = fields(
    {
        "kind": st.sampled_from(["server", "widget", "admin"]),
        "allowed_origins": st.lists(
            st.one_of(st.just("https://a.example"), nasty_text), max_size=3
        ),
    }
)


def encode(value: Any) -> bytes:
    # ensure_ascii keeps lone surrogates as escapes; allow_nan writes NaN / Infinity literals.
    return json.dumps(value).encode()


def raw_bodies(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[bytes, str | None]]:
    """(body, content type): JSON of the field strategy or of any value, or malformed bytes."""
    as_json = st.one_of(valid, valid, valid, json_values).map(encode)
    malformed = st.one_of(
        st.binary(max_size=48),
        st.sampled_from(
            [
                b"",
                b"{",
                b"\xff\xfe{}",
                b'{"a": "\xc3\x28"}',
                b"NaN",
                b'{"rpm": NaN}',
                b'{"temperature": Infinity}',
                b"[" * 5000,
                b'{"a": ' * 3000,
                b"1" * 5000,
            ]
        ),
        valid.map(lambda v: encode(v)[:-1]),  # truncated
    )
    ctype = st.sampled_from(
        [
            None,
            "application/json",
            "text/plain",
            "application/x-www-form-urlencoded",
            "application/json; charset=latin-1",
            "application/json; charset=no-such-charset",
        ]
    )
    return st.tuples(st.one_of(as_json, malformed), ctype)


# -- the live server ----------------------------------------------------------------------------
@contextlib.asynccontextmanager
async def served(settings: Any, model_dir: Path) -> AsyncIterator[LiveGateway]:
    """The gateway on loopback, on the runner ``kvgate serve`` uses (gateway/http.py)."""
    app = create_app(settings, model_dir=str(model_dir))
    server = settings.server
    runner = make_runner(
        app, server.header_timeout_s, server.body_timeout_s,
        handler_cancellation=True, shutdown_timeout=2.0,
    )  # fmt: skip
    await runner.setup()
    live = None
    try:
        await runner.listen_tcp("127.0.0.1", 0)
        host, port = runner.addresses[0][:2]
        live = LiveGateway(app, runner, f"http://{host}:{port}", InMemorySpanExporter())
        await app[STATE].pins.ready.wait()
        yield live
    finally:
        if live is not None:
            await live.close()
        await runner.cleanup()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(
    template_database: str, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[LiveGateway]:
    var_dir = tmp_path_factory.mktemp("robust")
    name = await create_database(template_database)
    try:
        async with served(make_settings(pg_url(name), var_dir), demo_model_dir) as live:
            yield live
    finally:
        await drop_database(name)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def tenant(gw: LiveGateway) -> TenantHandle:
    """The chat tenant; the admin properties change their own tenant (limits, status)."""
    return await gw.create_tenant("fuzz", system_prompt="Be brief.", limits={"rpm": 100000})


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def admin_tenant(gw: LiveGateway) -> TenantHandle:
    return await gw.create_tenant("fuzz-admin", system_prompt="Be brief.")


async def send(
    gw: LiveGateway, method: str, url: str, auth: str, body: bytes, ctype: str | None
) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {auth}"}
    if ctype is not None:
        headers["Content-Type"] = ctype
    async with gw.http.request(method, url, data=body, headers=headers) as resp:
        return resp.status, await resp.read()


def check(status: int, payload: bytes, sent: bytes) -> None:
    assert status < 500, (status, payload[:300], sent[:300])
    if status < 400:
        return
    err = json.loads(payload)["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    assert err["param"] is None or isinstance(err["param"], str), err
    assert err["code"] is None or isinstance(err["code"], str), err


# -- properties ---------------------------------------------------------------------------------
@FUZZ
@given(data=st.data())
async def test_chat_never_5xx(gw: LiveGateway, tenant: TenantHandle, data: st.DataObject) -> None:
    body, ctype = data.draw(raw_bodies(chat_body(gw.state.model_name)))
    url = f"{gw.base_url}/v1/chat/completions"
    status, payload = await send(gw, "POST", url, tenant.key, body, ctype)
    check(status, payload, body)


ADMIN_ROUTES = {
    "create": ("POST", "/tenants", tenant_create),
    "patch": ("PATCH", "/tenants/{id}", tenant_patch),
    "prompt": ("PUT", "/tenants/{id}/system-prompt", prompt_set),
    "keys": ("POST", "/tenants/{id}/keys", key_create),
    "limits": ("PUT", "/tenants/{id}/limits", limits),
}


@pytest.mark.parametrize("route", list(ADMIN_ROUTES))
@FUZZ
@given(data=st.data())
async def test_admin_mutations_never_5xx(
    gw: LiveGateway, admin_tenant: TenantHandle, route: str, data: st.DataObject
) -> None:
    method, path, strategy = ADMIN_ROUTES[route]
    body, ctype = data.draw(raw_bodies(strategy))
    url = f"{gw.base_url}/admin/v1{path.format(id=admin_tenant.id)}"
    status, payload = await send(gw, method, url, ADMIN_TOKEN, body, ctype)
    check(status, payload, body)
    # Suspending the tenant is a legal outcome of PATCH; later examples need it active.
    if route == "patch" and status == 200 and json.loads(payload)["status"] != "active":
        await gw.admin("PATCH", f"/tenants/{admin_tenant.id}", {"status": "active"})


@pytest.mark.parametrize(
    ("method", "path", "body", "ctype", "param"),
    [
        ("PUT", "/limits", b'{"rpm": 2147483648}', None, "rpm"),
        ("PUT", "/limits", b'{"tpm": 100000000000000000000}', None, "tpm"),
        ("PATCH", "", b'{"name": "a\\u0000b"}', None, "name"),
        ("PUT", "/system-prompt", b'{"text": "a\\u0000b"}', None, "text"),
        ("PUT", "/system-prompt", b'{"text": "\xff\xfe"}', None, None),
        ("PUT", "/system-prompt", b'{"text": "x"}', "application/json; charset=nope", None),
        ("PUT", "/limits", b'{"rpm": ' + b"9" * 5000 + b"}", None, None),
        ("PUT", "/limits", b"[" * 5000, None, None),
    ],
)
async def test_admin_edge_inputs_are_4xx(
    gw: LiveGateway,
    admin_tenant: TenantHandle,
    method: str,
    path: str,
    body: bytes,
    ctype: str | None,
    param: str | None,
) -> None:
    url = f"{gw.base_url}/admin/v1/tenants/{admin_tenant.id}{path}"
    status, payload = await send(gw, method, url, ADMIN_TOKEN, body, ctype)
    assert status in (400, 422), (status, payload)
    check(status, payload, body)
    assert json.loads(payload)["error"]["param"] == param


PARAM_ROUTES = [
    ("GET", "/tenants/{id}"),
    ("PATCH", "/tenants/{id}"),
    ("DELETE", "/tenants/{id}"),
    ("PUT", "/tenants/{id}/system-prompt"),
    ("GET", "/tenants/{id}/system-prompts"),
    ("POST", "/tenants/{id}/keys"),
    ("DELETE", "/tenants/{id}/keys/{key_id}"),
    ("PUT", "/tenants/{id}/limits"),
    ("GET", "/tenants/{id}/cache"),
    ("GET", "/tenants?limit={q}&cursor={q}&status={q}"),
    ("GET", "/audit?tenant={q}&limit={q}&cursor={q}"),
]
url_text = st.text(alphabet=st.characters(exclude_categories=("Cs",)), min_size=1, max_size=24)


@FUZZ
@given(
    route=st.sampled_from(PARAM_ROUTES),
    values=st.tuples(st.one_of(url_text, st.just("\x00")), url_text, url_text),
)
async def test_admin_path_and_query_values_never_5xx(
    gw: LiveGateway, route: tuple[str, str], values: tuple[str, str, str]
) -> None:
    method, template = route
    tenant_id, key_id, q = (quote(v, safe="") for v in values)
    path = template.format(id=tenant_id, key_id=key_id, q=q)
    url = URL(f"{gw.base_url}/admin/v1{path}", encoded=True)
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with gw.http.request(method, url, data=b'{"text": "x"}', headers=headers) as resp:
        check(resp.status, await resp.read(), path.encode())


# -- encodings and header lines -----------------------------------------------------------------
ENCODINGS = ["gzip", "deflate", "GZIP", "br", "zstd", "x-gzip", "compress", "identity",
             "gzip, gzip", "gzip;q=1", " ", "\u00e9", "deflate\tgzip"]  # fmt: skip


BOMB = gzip.compress(b"[" * 4_000_000)  # decompresses past the body limit


def encoded_bodies(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[bytes, str]]:
    """(body, Content-Encoding): a JSON body compressed rightly, wrongly or not at all."""
    plain = st.one_of(valid.map(encode), st.binary(max_size=48))
    packed = st.one_of(
        plain,
        plain.map(gzip.compress),
        plain.map(zlib.compress),
        plain.map(lambda b: gzip.compress(b)[: max(1, len(b) // 2)]),  # cut short
        plain.map(lambda b: b"\x1f\x8b\x08" + b),  # a gzip header, then junk
        st.just(BOMB),
    )
    return st.tuples(packed, st.sampled_from(ENCODINGS))


async def send_encoded(
    gw: LiveGateway, method: str, url: str, auth: str, body: bytes, encoding: str
) -> tuple[int, bytes]:
    headers = {
        "Authorization": f"Bearer {auth}",
        "Content-Type": "application/json",
        "Content-Encoding": encoding,
    }
    async with gw.http.request(method, url, data=body, headers=headers) as resp:
        payload = await resp.read()
        if resp.status >= 400:
            assert resp.headers.get("x-request-id"), resp.headers
        return resp.status, payload


@FUZZ
@given(data=st.data())
async def test_chat_bodies_in_any_encoding_never_5xx(
    gw: LiveGateway, tenant: TenantHandle, data: st.DataObject
) -> None:
    body, encoding = data.draw(encoded_bodies(chat_body(gw.state.model_name)))
    url = f"{gw.base_url}/v1/chat/completions"
    status, payload = await send_encoded(gw, "POST", url, tenant.key, body, encoding)
    check(status, payload, body)


@FUZZ
@given(route=st.sampled_from(list(ADMIN_ROUTES)), data=st.data())
async def test_admin_bodies_in_any_encoding_never_5xx(
    gw: LiveGateway, admin_tenant: TenantHandle, route: str, data: st.DataObject
) -> None:
    method, path, strategy = ADMIN_ROUTES[route]
    body, encoding = data.draw(encoded_bodies(strategy))
    url = f"{gw.base_url}/admin/v1{path.format(id=admin_tenant.id)}"
    status, payload = await send_encoded(gw, method, url, ADMIN_TOKEN, body, encoding)
    check(status, payload, body)
    if route == "patch" and status == 200 and json.loads(payload)["status"] != "active":
        await gw.admin("PATCH", f"/tenants/{admin_tenant.id}", {"status": "active"})


async def test_encoded_bodies_are_decoded_or_refused_exactly(
    gw: LiveGateway, tenant: TenantHandle
) -> None:
    body = encode(
        {"model": gw.state.model_name, "messages": [{"role": "user", "content": "hi"}],
         "max_tokens": 2}
    )  # fmt: skip
    url = f"{gw.base_url}/v1/chat/completions"
    expected = [
        (gzip.compress(body), "gzip", 200),
        (zlib.compress(body), "deflate", 200),
        (body, "identity", 200),
        (body, "gzip", 400),
        (body, "deflate", 400),
        (body, "br", 415),
        (body, "x-gzip", 415),
    ]
    for raw, encoding, status in expected:
        got, payload = await send_encoded(gw, "POST", url, tenant.key, raw, encoding)
        assert got == status, (encoding, payload[:200])
        check(got, payload, raw)


CONTROL = [bytes([c]) for c in (*range(0, 9), *range(10, 32), 127)] + [b"\r", b"\xff", b" \x01"]


@FUZZ
@given(
    where=st.sampled_from(["after", "before", "name", "other"]),
    junk=st.lists(st.sampled_from(CONTROL), min_size=1, max_size=3).map(b"".join),
    route=st.sampled_from(["chat", "admin"]),
)
async def test_header_lines_with_control_bytes_never_5xx_nor_quoted(
    gw: LiveGateway, tenant: TenantHandle, where: str, junk: bytes, route: str
) -> None:
    secret = (tenant.key if route == "chat" else ADMIN_TOKEN).encode()
    line = {
        "after": b"Authorization: Bearer " + secret + junk,
        "before": b"Authorization: Bearer " + junk + secret,
        "name": b"Authoriz" + junk + b"ation: Bearer " + secret,
        "other": b"X-Forwarded-Key: " + secret + junk,
    }[where]
    path = b"/v1/chat/completions" if route == "chat" else b"/admin/v1/tenants"
    body = b"{}"
    raw = b"POST " + path + b" HTTP/1.1\r\nHost: t\r\nConnection: close\r\n" + line
    raw += b"\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n" + body
    host, port = URL(gw.base_url).host, URL(gw.base_url).port
    with structlog.testing.capture_logs() as events, _stdlib_records() as records:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(raw)
            async with asyncio.timeout(10):
                reply = await reader.read()
        finally:
            writer.close()
    head, _, payload = reply.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    check(status, payload, raw)
    assert secret not in reply, reply[:300]
    logged = repr(events) + "".join(records)
    assert secret.decode() not in logged


async def _answer(
    http: aiohttp.ClientSession, method: str, url: str, headers: dict[str, str], body: bytes
) -> tuple[int, bytes]:
    async with http.request(method, URL(url, encoded=True), data=body, headers=headers) as resp:
        return resp.status, await resp.read()


@contextlib.contextmanager
def _stdlib_records() -> Any:
    """Every stdlib log record (formatted, with its exception), while the block runs."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(logging.Formatter().format(record) + repr(vars(record)))

    handler, root = Keep(logging.DEBUG), logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield lines
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


SECRET = "sk-hostile-0d5e8a11c9"


async def test_no_secret_reaches_logs_or_error_bodies(
    gw: LiveGateway, tenant: TenantHandle
) -> None:
    """A batch of hostile requests, each carrying a known secret where a client can put one;
    access logging on (as in these tests' runner): the secret is in no answer and no log line."""
    chat = f"{gw.base_url}/v1/chat/completions"
    ok = {"model": gw.state.model_name, "max_tokens": 2}
    said = {**ok, "messages": [{"role": "user", "content": f"my key is {SECRET}"}]}
    key = {"Authorization": f"Bearer {tenant.key}"}
    hostile: list[tuple[str, str, dict[str, str], bytes]] = [
        ("POST", chat, {"Authorization": f"Bearer {SECRET}"}, encode(said)),
        ("POST", chat, {"Authorization": SECRET}, encode(said)),
        ("POST", chat, key, encode(said)),  # 200: the prompt is not logged
        ("POST", chat, key, encode({**said, "model": SECRET})),
        ("POST", chat, key, SECRET.encode()),
        ("POST", chat, key, encode({**said, "messages": [{"role": SECRET, "content": "x"}]})),
        ("POST", chat + f"?api_key={SECRET}", key, b"{"),
        ("POST", chat, {"User-Agent": SECRET, "Referer": f"https://x/{SECRET}"}, b"{}"),
        ("POST", chat, {"Cookie": f"session={SECRET}", "X-Request-Id": SECRET}, b"{}"),
        ("POST", chat, {**key, "Content-Encoding": SECRET}, b"{}"),
        ("POST", chat, {**key, "Content-Type": f"application/json; charset={SECRET}"}, b"{}"),
        ("GET", f"{gw.base_url}/v1/{SECRET}", key, b""),
        ("GET", f"{gw.base_url}/admin/v1/tenants", {"Authorization": f"Bearer {SECRET}"}, b""),
        ("PUT", f"{gw.base_url}/admin/v1/tenants/{tenant.id}/system-prompt",
         {"Authorization": f"Bearer {ADMIN_TOKEN}"}, encode({"text": f"Be brief. {SECRET}"})),
        ("PUT", f"{gw.base_url}/admin/v1/tenants/{tenant.id}/system-prompt",
         {"Authorization": f"Bearer {ADMIN_TOKEN}"}, encode({"text": "Be brief."})),
    ]  # fmt: skip
    # An unknown field is named in the answer (OpenAI's wording): its sender chose the name.
    # It still stays out of the logs.
    named = [("POST", chat, key, encode({SECRET: 1, **said}))]
    with structlog.testing.capture_logs() as events, _stdlib_records() as records:
        # A session of its own: its connections are made while access logging is enabled.
        async with aiohttp.ClientSession() as http:
            answers = [
                await _answer(http, method, url, headers, body)
                for method, url, headers, body in hostile + named
            ]
    for (method, url, headers, body), (status, payload) in zip(
        hostile + named, answers, strict=True
    ):
        check(status, payload, body)
        if status >= 400 and (method, url, headers, body) not in named:
            assert SECRET.encode() not in payload, (url, headers, payload)
    logged = repr(events) + "".join(records)
    assert SECRET not in logged
    assert tenant.key not in logged and ADMIN_TOKEN not in logged
    assert sum("http_access" in r for r in records) == len(hostile + named)  # access log on
