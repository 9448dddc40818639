"""The contract check itself: it catches what OpenAI's schemas forbid (the answers kvgate used to
send among them), reads OpenAPI's ``nullable``, and sees every kind of answer of a live gateway."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.contract import (
    CHAT,
    CHUNK,
    ERROR,
    MODELS,
    ContractTransport,
    contract_client,
    document,
    responses_document,
    violations,
)
from tests.gateway.harness import gateway_on_fresh_database

ANSWER: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "demo",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hi", "refusal": None},
            "finish_reason": "stop",
            "logprobs": None,
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}
CHUNK_BODY: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion.chunk",
    "created": 1,
    "model": "demo",
    "choices": [{"index": 0, "delta": {"content": "h"}, "finish_reason": None, "logprobs": None}],
}


def test_provenance_is_kept() -> None:
    source = document()["source"]
    assert source["repo"] == "openai/openai-openapi" and len(source["commit"]) == 40


def test_conforming_bodies_pass() -> None:
    assert violations(CHAT, ANSWER) == []
    assert violations(CHUNK, CHUNK_BODY) == []  # logprobs: null is OpenAPI's nullable
    assert violations(MODELS, {"object": "list", "data": []}) == []
    error = {
        "error": {"message": "m", "type": "invalid_request_error", "param": None, "code": None}
    }
    assert violations(ERROR, error) == []


@pytest.mark.parametrize(
    ("path", "value", "where"),
    [
        (("choices", 0, "message", "refusal"), ..., "refusal"),  # the field kvgate lacked
        (("choices", 0, "finish_reason"), "done", "finish_reason"),
        (("choices", 0, "message", "tool_calls"), [{"id": "c", "type": "function"}], "function"),
        (("usage", "total_tokens"), "4", "total_tokens"),
    ],
)
def test_violations_are_found(path: tuple[Any, ...], value: Any, where: str) -> None:
    body = copy.deepcopy(ANSWER)
    node = body
    for key in path[:-1]:
        node = node[key]
    if value is ...:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    found = violations(CHAT, body)
    assert found and any(where in v for v in found), found


async def test_every_kind_of_answer_is_checked(
    template_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    import openai

    async with gateway_on_fresh_database(template_database, demo_model_dir, tmp_path) as gw:
        tenant = await gw.create_tenant("contract")
        failures: list[str] = []
        transport = ContractTransport(failures)
        client = contract_client(f"{gw.base_url}/v1", tenant.key, transport)
        args: dict[str, Any] = {"model": gw.state.model_name, "max_tokens": 3}
        msgs = [{"role": "user", "content": "hi"}]
        await client.chat.completions.create(**args, messages=msgs)
        stream = await client.chat.completions.create(
            **args, messages=msgs, stream=True, stream_options={"include_usage": True}
        )
        events = [event async for event in stream]
        await client.models.list()
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(**{**args, "model": "nope"}, messages=msgs)
        await client.close()
        assert failures == []
        assert transport.checked == 1 + len(events) + 1 + 1


def test_responses_schemas_are_kept_and_enforced() -> None:
    """The vendored Responses schemas name their source, and a Response missing a required
    field or carrying a wrong status is caught (the live checks rely on it)."""
    assert "commit" in responses_document()["$comment"]
    body = {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "model": "demo",
        "tools": [],
        "output": [],
        "parallel_tool_calls": True,
        "metadata": {},
        "tool_choice": "auto",
        "temperature": 1.0,
        "top_p": 1.0,
    }
    assert violations("Response", body) == []
    assert any("status" in v for v in violations("Response", {**body, "status": "done"}))
    del body["output"]
    assert any("output" in v for v in violations("Response", body))
