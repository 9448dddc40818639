"""The OpenAPI document: 3.1, generated from the pydantic models, every route of the app, the
error schema and both bearer schemes; served at /openapi.json without auth."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from jsonschema import Draft202012Validator

from gateway.app import create_app
from gateway.chat.schemas import ChatRequest
from gateway.openapi.document import ADMIN_TOKEN, REF, TENANT_KEY, build_document
from tenants.schemas import KeyCreate, TenantCreate
from tests.gateway.harness import live_gateway, make_settings

METHODS = {"get", "post", "put", "patch", "delete"}


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return build_document("demo-model")


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def test_openapi_31_with_bearer_schemes(doc: dict[str, Any]) -> None:
    assert doc["openapi"] == "3.1.0"
    schemes = doc["components"]["securitySchemes"]
    assert schemes[TENANT_KEY] == {**schemes[TENANT_KEY], "type": "http", "scheme": "bearer"}
    assert schemes[ADMIN_TOKEN] == {**schemes[ADMIN_TOKEN], "type": "http", "scheme": "bearer"}
    for path, item in doc["paths"].items():
        for method, op in item.items():
            (requirement,) = op["security"] or [{None: []}]
            public = path.startswith("/admin/ui") or (method, path) in {
                ("post", "/admin/v1/session"),
                ("get", "/admin/v1/session/status"),
            }
            expected = (
                ADMIN_TOKEN
                if path.startswith("/admin/") and not public
                else TENANT_KEY
                if path.startswith("/v1/")
                else None
            )
            assert list(requirement) == [expected], (method, path)
            if expected is not None:
                assert "401" in op["responses"], (method, path)


def test_every_error_answer_is_the_error_schema(doc: dict[str, Any]) -> None:
    error = doc["components"]["schemas"]["ErrorBody"]
    assert error["required"] == ["error"]
    detail = doc["components"]["schemas"]["ErrorDetail"]
    assert set(detail["required"]) == {"message", "type", "param", "code"}
    for item in doc["paths"].values():
        for op in item.values():
            for status, resp in op["responses"].items():
                if int(status) >= 400 and op["operationId"] != "ready":
                    ref = resp["content"]["application/json"]["schema"]["$ref"]
                    assert ref == REF.format(model="ErrorBody")


def test_schemas_are_the_pydantic_models(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    for name in schemas:
        Draft202012Validator.check_schema(schemas[name])
    for ref in _refs(doc):
        assert ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in schemas
    for model in (ChatRequest, TenantCreate, KeyCreate):
        generated = model.model_json_schema(ref_template=REF)
        generated.pop("$defs", None)
        published = copy.deepcopy(schemas[model.__name__])
        published.get("properties", {}).get("model", {}).pop("examples", None)
        assert published == generated, model.__name__
    assert schemas["ChatRequest"]["properties"]["model"]["examples"] == ["demo-model"]
    body = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"]["$ref"].endswith("/ChatRequest")
    ok = doc["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
    assert set(ok) == {"application/json", "text/event-stream"}


def test_links_name_existing_operations(doc: dict[str, Any]) -> None:
    ops = {op["operationId"]: op for item in doc["paths"].values() for op in item.values()}
    linked = 0
    for op in ops.values():
        for resp in op["responses"].values():
            for link in resp.get("links", {}).values():
                target = ops[link["operationId"]]
                names = {p["name"] for p in target.get("parameters", []) if p["in"] == "path"}
                assert set(link["parameters"]) == names, link
                linked += 1
    assert linked >= 10


def _app_routes(app: web.Application) -> set[tuple[str, str]]:
    out: set[tuple[str, str]] = set()
    for resource in app.router.resources():
        info = resource.get_info()
        if "app" in info:  # a sub-app (the admin API)
            out |= _app_routes(info["app"])  # its resources carry the prefix already
            continue
        for route in resource:
            if route.method.lower() in METHODS:
                out.add((route.method.lower(), resource.canonical))
    return out


@pytest.mark.parametrize("widget_demo", [False, True])
def test_every_route_of_the_app_is_documented(
    widget_demo: bool, demo_model_dir: Path, tmp_path: Path
) -> None:
    demo = "true" if widget_demo else "false"
    url = f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"
    app = create_app(
        make_settings(url, tmp_path, KVGATE_WIDGET_DEMO=demo), model_dir=str(demo_model_dir)
    )
    doc = build_document("demo-model", widget_demo=widget_demo)
    documented = {(m, path) for path, item in doc["paths"].items() for m in item}
    served = _app_routes(app)
    assert served - documented == set(), (
        "routes missing from gateway/openapi/document.py OPERATIONS"
    )
    assert documented - served == set(), "documented routes the app does not serve"
    assert {("get", "/healthz"), ("get", "/readyz"), ("get", "/v1/models")} <= documented
    assert (("get", "/widget/demo") in documented) == widget_demo
    assert ("get", "/metrics") not in documented  # the metrics listener is not the API


async def test_served_without_auth(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    async with live_gateway(make_settings(gateway_database, tmp_path), demo_model_dir) as gw:
        async with gw.http.get(f"{gw.base_url}/openapi.json") as resp:
            assert resp.status == 200 and resp.content_type == "application/json"
            served = await resp.json()
        assert served == build_document(gw.state.model_name)


async def test_documented_headers_on_success_and_429(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    """The rate-limit path, which the schemathesis run's tenant never reaches: the 200 and the
    429 carry the headers the document declares."""
    doc = build_document()
    op = doc["paths"]["/v1/chat/completions"]["post"]["responses"]
    async with live_gateway(make_settings(gateway_database, tmp_path), demo_model_dir) as gw:
        t = await gw.create_tenant("hdrs", limits={"rpm": 1})
        body = {"model": gw.state.model_name, "messages": [{"role": "user", "content": "hi"}]}
        headers = {"Authorization": f"Bearer {t.key}"}
        url = f"{gw.base_url}/v1/chat/completions"
        for status in (200, 429):
            async with gw.http.post(url, json=body, headers=headers) as resp:
                assert resp.status == status
                documented = op[str(status)]["headers"]
                for name, spec in documented.items():
                    if spec["required"]:
                        assert name in resp.headers, (status, name)
                    if name in resp.headers and "pattern" in spec["schema"]:
                        assert re.match(spec["schema"]["pattern"], resp.headers[name])
                assert resp.headers["x-ratelimit-limit-requests"] == "1"
