"""What the vLLM tests send: token-id prompts through the official ``openai`` client."""

from __future__ import annotations

import json
import random
import secrets
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import openai

from tests.vllm.servers import MODEL_NAME, VllmServer

BLOCK = 128  # vLLM's CPU block size: prefix caching works in whole blocks of 128 tokens


def client(server: VllmServer, api_key: str | None) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=api_key, max_retries=0)


def async_client(server: VllmServer, api_key: str | None) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=api_key, max_retries=0)


def http(
    server: VllmServer, path: str, body: dict[str, Any] | None = None, key: str | None = None
) -> tuple[int, Any]:
    """(status, JSON body) of a GET (no body) or POST to the server, beside the openai client
    (vLLM's own routes: /health, /tokenize)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(server.base_url + path, data=data)
    req.add_header("Content-Type", "application/json")
    if key is not None:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def random_ids(n: int, seed: int | None = None) -> list[int]:
    """``n`` ordinary token ids (no control tokens: SmolLM2's are below 17), unique per call
    unless seeded, so no other test's blocks match them."""
    rng = random.Random(seed if seed is not None else secrets.randbits(64))
    return [rng.randrange(100, 49_000) for _ in range(n)]


def salt() -> str:
    return secrets.token_urlsafe(32)


@dataclass
class Streamed:
    text: str = ""
    finish_reason: str | None = None
    usage: Any = None
    chunks: int = 0
    token_ids: list[int] = field(default_factory=list)


def stream(c: openai.OpenAI, prompt: list[int], **kwargs: Any) -> Streamed:
    """A streamed ``/v1/completions`` call with usage in the last chunk; ``extra_body`` takes
    vLLM's own fields (``cache_salt``, ``priority``, ``structured_outputs``, ...)."""
    kwargs.setdefault("max_tokens", 4)
    kwargs.setdefault("temperature", 0.0)
    extra = {"return_token_ids": True, **kwargs.pop("extra_body", {})}
    out = Streamed()
    for chunk in c.completions.create(
        model=MODEL_NAME,
        prompt=prompt,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=extra,
        **kwargs,
    ):
        out.chunks += 1
        if chunk.usage is not None:
            out.usage = chunk.usage
        for choice in chunk.choices:
            out.text += choice.text
            out.finish_reason = choice.finish_reason or out.finish_reason
            out.token_ids += list(getattr(choice, "token_ids", None) or [])
    return out


def cached_tokens(result: Streamed) -> int:
    details = result.usage.prompt_tokens_details
    return int(details.cached_tokens) if details is not None else 0
