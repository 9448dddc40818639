"""OpenAI's own contract, checked on every answer a test's ``openai`` client receives.

``chat-schemas.json`` (here) is vendored from /work/shared/openai/chat-schemas.json: the chat
schemas of OpenAI's published OpenAPI document (github.com/openai/openai-openapi, openapi.json,
the commit in its ``source``), copied verbatim. The document is OpenAPI 3.1 but keeps a few
3.0 ``nullable: true`` marks, which JSON Schema ignores; they are read as OpenAPI means them
(the value may also be null) before validating.

``ContractTransport`` sits under the client (a transport of httpx2, the SDK's HTTP library;
public API) and validates, by route:

    POST /v1/chat/completions   the answer: CreateChatCompletionResponse; each SSE event of a
                                stream: CreateChatCompletionStreamResponse (an error event:
                                ErrorResponse)
    GET /v1/models              ListModelsResponse
    any error answer            ErrorResponse

and, from ``responses-schemas.json`` (vendored the same way from
/work/shared/openai/responses-schemas.json: the Responses and Conversations schemas):

    POST /v1/responses, GET /v1/responses/{id}            Response; each stream event:
                                                          ResponseStreamEvent
    GET /v1/responses/{id}/input_items                    ResponseItemList
    POST /v1/conversations, GET/POST /v1/conversations/{id}, DELETE .../items/{item}
                                                          ConversationResource
    DELETE /v1/conversations/{id}                         DeletedConversationResource
    GET/POST /v1/conversations/{id}/items                 ConversationItemList
    GET /v1/conversations/{id}/items/{item}               ConversationItem

and the bodies of accepted requests: POST /v1/responses (CreateResponse), POST
/v1/conversations (CreateConversationBody), POST /v1/conversations/{id}
(UpdateConversationBody).

Violations are collected in ``failures`` (the client itself is not disturbed), and the fixture
that made the client fails the test when there are any.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from functools import cache
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
from jsonschema import Draft202012Validator

SCHEMAS = Path(__file__).with_name("chat-schemas.json")
RESPONSES_SCHEMAS = Path(__file__).with_name("responses-schemas.json")
CHAT = "CreateChatCompletionResponse"
CHUNK = "CreateChatCompletionStreamResponse"
MODELS = "ListModelsResponse"
ERROR = "ErrorResponse"
STREAM_EVENT = "ResponseStreamEvent"


def _nullable(node: Any) -> Any:
    if isinstance(node, list):
        return [_nullable(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _nullable(v) for k, v in node.items() if k != "nullable"}
    if node.get("nullable") is True:
        return {"anyOf": [out, {"type": "null"}]}
    return out


@cache
def document() -> dict[str, Any]:
    return json.loads(SCHEMAS.read_text())


@cache
def responses_document() -> dict[str, Any]:
    return json.loads(RESPONSES_SCHEMAS.read_text())


@cache
def validator(name: str) -> Draft202012Validator:
    doc = document()
    if name not in doc["components"]["schemas"]:
        doc = responses_document()
    components = _nullable(doc["components"])
    return Draft202012Validator({"$ref": f"#/components/schemas/{name}", "components": components})


def violations(name: str, body: Any) -> list[str]:
    """Where ``body`` breaks schema ``name`` (empty: it conforms)."""
    errors = sorted(validator(name).iter_errors(body), key=lambda e: list(e.absolute_path))
    return [f"{name} at /{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors]


def assert_conforms(name: str, body: Any) -> None:
    found = violations(name, body)
    assert not found, "\n".join(found)


def _schema_for(request: httpx.Request, status: int) -> str | None:
    path = request.url.path
    if not path.startswith("/v1/"):
        return None
    if status >= 400:
        return ERROR
    if request.method == "POST" and path.endswith("/chat/completions"):
        return CHAT
    if request.method == "GET" and path.endswith("/models"):
        return MODELS
    return _responses_schema(request.method, path.removeprefix("/v1/").split("/"))


def _request_schema(request: httpx.Request) -> str | None:
    """The schema of an accepted request body (Responses and Conversations creations)."""
    parts = request.url.path.removeprefix("/v1/").split("/")
    if request.method != "POST":
        return None
    if parts == ["responses"]:
        return "CreateResponse"
    if parts == ["conversations"]:
        return "CreateConversationBody"
    if parts[0] == "conversations" and len(parts) == 2:
        return "UpdateConversationBody"
    return None


def _responses_schema(method: str, parts: list[str]) -> str | None:
    """The schema of a Responses / Conversations answer (``parts``: the path after /v1/)."""
    if parts[0] == "responses":
        if len(parts) <= 2 and method in ("POST", "GET"):
            return "Response"
        return "ResponseItemList" if parts[-1] == "input_items" else None
    if parts[0] != "conversations":
        return None
    if len(parts) <= 2:
        return "DeletedConversationResource" if method == "DELETE" else "ConversationResource"
    if len(parts) == 3:
        return "ConversationItemList"
    return "ConversationResource" if method == "DELETE" else "ConversationItem"


class ContractTransport(httpx.AsyncBaseTransport):
    def __init__(self, failures: list[str]) -> None:
        self.failures = failures
        self.checked = 0  # answers and events validated
        self._inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        resp = await self._inner.handle_async_request(request)
        body_schema = _request_schema(request)
        if body_schema is not None and resp.status_code < 400:
            where = f"request {request.method} {request.url.path}"
            self.check(body_schema, request.content, where)  # what was accepted is OpenAI's
        name = _schema_for(request, resp.status_code)
        if name is None:
            return resp
        if resp.headers.get("content-type", "").startswith("text/event-stream"):
            event = STREAM_EVENT if name == "Response" else CHUNK
            stream = _EventCheck(resp.stream, self, event)  # type: ignore[arg-type]
            return httpx.Response(resp.status_code, headers=resp.headers, stream=stream)
        parts = [chunk async for chunk in resp.stream]  # type: ignore[union-attr]
        await resp.aclose()
        content = b"".join(parts)
        self.check(name, content, f"{request.method} {request.url.path} {resp.status_code}")
        return httpx.Response(resp.status_code, headers=resp.headers, content=content)

    def check(self, name: str, raw: bytes, where: str) -> None:
        self.checked += 1
        try:
            body = json.loads(raw)
        except ValueError:
            self.failures.append(f"{where}: not JSON: {raw[:200]!r}")
            return
        if name in (CHUNK, STREAM_EVENT) and isinstance(body, dict) and "error" in body:
            name = ERROR  # an error event in a stream
        self.failures.extend(f"{where}: {v}" for v in violations(name, body))

    async def aclose(self) -> None:
        await self._inner.aclose()


class _EventCheck(httpx.AsyncByteStream):
    """Passes an SSE stream through unchanged, validating each ``data:`` event on the way."""

    def __init__(
        self, inner: httpx.AsyncByteStream, contract: ContractTransport, name: str
    ) -> None:
        self._name = name
        self._inner = inner
        self._contract = contract
        self._buf = b""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._buf += chunk
            while b"\n\n" in self._buf:
                event, self._buf = self._buf.split(b"\n\n", 1)
                self._event(event)
            yield chunk

    def _event(self, event: bytes) -> None:
        for line in event.split(b"\n"):
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                self._contract.check(self._name, line[6:], "stream event")

    async def aclose(self) -> None:
        await self._inner.aclose()


def contract_client(
    base_url: str, key: str, contract: ContractTransport, **kwargs: Any
) -> openai.AsyncOpenAI:
    """An ``AsyncOpenAI`` client whose every answer ``contract`` validates."""
    http = openai.DefaultAsyncHttpx2Client(transport=contract)
    return openai.AsyncOpenAI(
        base_url=base_url, api_key=key, max_retries=0, http_client=http, **kwargs
    )
