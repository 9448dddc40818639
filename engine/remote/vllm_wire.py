"""What the gateway sends a vLLM server and reads back (vLLM 0.32's OpenAI server; no torch).

One request is ``POST /v1/completions`` with the prompt as token ids, streamed::

    {"model", "prompt": [ids], "max_tokens", "stream": true,
     "stream_options": {"include_usage": true}, "return_token_ids": true,
     "cache_salt": <tenant's>, sampling fields, "logprobs": k + "return_tokens_as_token_ids",
     "structured_outputs": {"json" | "regex": ...}, "priority" (when the server schedules by it)}

and answers SSE chunks ``data: {...}``: per chunk the new tokens' ids (``choices[0].token_ids``),
their log-probabilities (tokens named ``token_id:N``), a ``finish_reason`` once, then a last
chunk without choices carrying ``usage`` (``prompt_tokens_details.cached_tokens``:
``--enable-prompt-tokens-details``), then ``data: [DONE]``. An error after the stream began comes
as ``data: {"error": {...}}``.

vLLM salts only a prompt's first block (its hash chains every later one), so the salt covers
the whole prompt: the tenant's cache salt, or, where the request asks for a per-visitor cache
(a ``CacheScope`` sharing no tokens), the tenant's salt with the visitor's (``vllm_salt``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from engine.api import CacheScope, GenerateOptions
from engine.constraints import Grammar
from engine.outputs import FinishReason, TokenLogprob
from engine.params import SamplingParams

TOKEN_PREFIX = "token_id:"  # vLLM's name of a token under return_tokens_as_token_ids
# The grammar kinds vLLM's default structured-output backend (xgrammar) enforces from what the
# gateway sends; llguidance's Lark dialect (the gateway's tool-call grammars) is not among them.
VLLM_GRAMMARS = frozenset({"json_schema", "regex"})
# interactive first; batch after (vLLM: a lower priority value runs earlier)
PRIORITY_VALUES = {"interactive": 0, "batch": 1}


class ChunkError(ValueError):
    """A chunk that is not what vLLM's completions stream sends."""


def vllm_salt(namespace: str, scope: CacheScope | None) -> str:
    """The ``cache_salt`` of a request: the tenant's (``namespace``), or per visitor when the
    request's scope shares no token (the tenant's per-visitor setting): vLLM cannot share a
    tenant prefix and keep what follows it private, so a scope that shares tokens is served
    under the tenant's salt (docs/contracts.md, "Through vLLM")."""
    if scope is None or scope.shared_tokens > 0:
        return namespace
    return f"{namespace}/{scope.salt_bytes.hex()}"


def structured_outputs(grammar: Grammar) -> dict[str, object]:
    """vLLM's ``structured_outputs`` field for a grammar of ``VLLM_GRAMMARS``."""
    if grammar.kind == "json_schema":
        schema = json.loads(grammar.source)
        if isinstance(schema, dict):
            schema.pop("x-guidance", None)  # llguidance's options: the spelling below says it
        return {"json": schema, "disable_any_whitespace": True}
    if grammar.kind == "regex":
        return {"regex": grammar.source}
    raise ValueError(f"vLLM cannot enforce a {grammar.kind} grammar")


def completion_body(
    model: str,
    token_ids: list[int],
    params: SamplingParams,
    options: GenerateOptions,
    *,
    priority: bool = False,
) -> dict[str, Any]:
    """The JSON body of one streamed token-id completion."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": token_ids,
        "max_tokens": params.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "cache_salt": vllm_salt(options.namespace, options.cache_scope),
        "temperature": params.temperature,
        "top_p": params.top_p,
        "min_p": params.min_p,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "repetition_penalty": params.repetition_penalty,
        "ignore_eos": params.ignore_eos,
        "skip_special_tokens": False,
    }
    if params.top_k > 0:
        body["top_k"] = params.top_k
    if params.seed is not None:
        body["seed"] = params.seed
    if params.stop_token_ids:
        body["stop_token_ids"] = list(params.stop_token_ids)
    if params.logit_bias:
        body["logit_bias"] = {str(t): b for t, b in params.logit_bias}
    if params.logprobs is not None:
        body["logprobs"] = params.logprobs
        body["return_tokens_as_token_ids"] = True
    if params.grammar is not None:
        body["structured_outputs"] = structured_outputs(params.grammar)
    if priority:
        body["priority"] = PRIORITY_VALUES[options.priority]
    return body


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class Chunk:
    """One SSE event of the stream: new tokens (with their logprobs when asked), a finish
    reason, the usage (the last chunk), or the server's error message."""

    token_ids: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprob, ...] | None = None
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    error: str | None = None


def parse_chunk(data: object, top_k: int | None) -> Chunk:
    """One ``data:`` payload (parsed JSON); ``top_k``: the logprobs asked for (None: none)."""
    if not isinstance(data, dict):
        raise ChunkError("a chunk is not a JSON object")
    if "error" in data:
        err = data["error"]
        message = err.get("message") if isinstance(err, dict) else None
        return Chunk(error=str(message or err))
    usage = _usage(data.get("usage"))
    choices = data.get("choices") or []
    if not isinstance(choices, list) or len(choices) > 1:
        raise ChunkError("a chunk holds more than one choice (the gateway asks for one)")
    if not choices:
        return Chunk(usage=usage)
    choice = choices[0]
    if not isinstance(choice, dict):
        raise ChunkError("a choice is not an object")
    ids = tuple(int(t) for t in choice.get("token_ids") or ())
    lps = _logprobs(choice.get("logprobs"), ids, top_k) if top_k is not None else None
    return Chunk(ids, lps, _finish(choice.get("finish_reason")), usage)


def _finish(raw: object) -> FinishReason | None:
    if raw is None:
        return None
    if raw == "length":
        return "length"
    if raw == "abort":
        return "abort"
    return "stop"  # "stop" (EOS, a stop token) and any reason a later vLLM adds


def _usage(raw: object) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    details = raw.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(
        int(raw.get("prompt_tokens") or 0),
        int(raw.get("completion_tokens") or 0),
        int(cached or 0),
    )


def _token(name: object) -> int:
    if not isinstance(name, str) or not name.startswith(TOKEN_PREFIX):
        raise ChunkError(f"a logprob names {name!r}, not {TOKEN_PREFIX}N")
    return int(name.removeprefix(TOKEN_PREFIX))


def _logprobs(raw: object, ids: tuple[int, ...], k: int) -> tuple[TokenLogprob, ...]:
    """The completions API's logprobs of the chunk's tokens, as the engine reports them: the
    sampled token's logprob and the ``k`` most likely, most likely first (vLLM adds the sampled
    token to its top list when it is not among them: dropped beyond ``k``)."""
    if not isinstance(raw, dict):
        raise ChunkError("logprobs asked for, none sent")
    tokens = raw.get("tokens") or []
    values = raw.get("token_logprobs") or []
    tops = raw.get("top_logprobs") or [None] * len(tokens)
    if not len(tokens) == len(values) == len(tops) == len(ids):
        raise ChunkError("logprobs do not match the chunk's tokens")
    out = []
    for name, value, top in zip(tokens, values, tops, strict=True):
        entries = sorted(
            ((_token(t), _finite(v)) for t, v in (top or {}).items()), key=lambda e: -e[1]
        )
        out.append(TokenLogprob(_token(name), _finite(value), tuple(entries[:k])))
    return tuple(out)


def _finite(value: object) -> float:
    number = float(value) if isinstance(value, int | float) else -math.inf
    return number if not math.isnan(number) else -math.inf
