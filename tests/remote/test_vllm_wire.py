"""The vLLM completions request and stream chunks (engine/remote/vllm_wire.py, vllm_probe.py)."""

from __future__ import annotations

import json

import pytest

from engine.api import CacheScope, GenerateOptions
from engine.constraints import Grammar
from engine.errors import GrammarRejected, PromptTooLong, RequestRejected
from engine.outputs import TokenLogprob
from engine.params import SamplingParams
from engine.remote.vllm_probe import event_sources, parse_metrics, served_model
from engine.remote.vllm_stream import rejection
from engine.remote.vllm_wire import ChunkError, Usage, completion_body, parse_chunk


def test_the_body_carries_every_sampling_field_and_the_salt() -> None:
    params = SamplingParams(
        max_tokens=7,
        temperature=0.5,
        top_p=0.9,
        top_k=20,
        seed=3,
        stop_token_ids=(2,),
        min_p=0.1,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.1,
        logit_bias=((5, -100.0),),
        logprobs=2,
        grammar=Grammar("json_schema", json.dumps({"type": "object", "x-guidance": {}})),
    )
    options = GenerateOptions("tenant-salt", "r1", priority="batch")
    body = completion_body("m", [1, 2, 3], params, options, priority=True)
    assert body["prompt"] == [1, 2, 3] and body["stream"] is True
    assert body["cache_salt"] == "tenant-salt" and body["priority"] == 1
    assert body["stream_options"] == {"include_usage": True} and body["return_token_ids"]
    assert (body["top_k"], body["seed"], body["stop_token_ids"]) == (20, 3, [2])
    assert body["logit_bias"] == {"5": -100.0}
    assert body["logprobs"] == 2 and body["return_tokens_as_token_ids"]
    assert body["structured_outputs"] == {
        "json": {"type": "object"},
        "disable_any_whitespace": True,
    }
    plain = completion_body("m", [1], SamplingParams(), GenerateOptions("s"))
    assert not {"top_k", "seed", "logprobs", "structured_outputs", "priority"} & set(plain)
    visitor = GenerateOptions("s", cache_scope=CacheScope(b"\xff", 0))
    assert completion_body("m", [1], SamplingParams(), visitor)["cache_salt"] == "s/ff"


def test_a_lark_grammar_is_not_sent() -> None:
    with pytest.raises(ValueError, match="lark"):
        completion_body(
            "m", [1], SamplingParams(grammar=Grammar("lark", "start: x")), GenerateOptions()
        )


def test_chunks_tokens_logprobs_finish_and_usage() -> None:
    chunk = {
        "choices": [
            {
                "index": 0,
                "text": "ab",
                "token_ids": [7, 8],
                "finish_reason": None,
                "logprobs": {
                    "tokens": ["token_id:7", "token_id:8"],
                    "token_logprobs": [-0.1, -0.2],
                    "top_logprobs": [
                        {"token_id:7": -0.1, "token_id:9": -2.0},
                        {"token_id:4": -0.05, "token_id:8": -0.2, "token_id:6": -3.0},
                    ],
                },
            }
        ]
    }
    c = parse_chunk(chunk, 1)
    assert c.token_ids == (7, 8) and c.finish_reason is None
    assert c.logprobs == (TokenLogprob(7, -0.1, ((7, -0.1),)), TokenLogprob(8, -0.2, ((4, -0.05),)))
    end = parse_chunk({"choices": [{"token_ids": [2], "finish_reason": "stop"}]}, None)
    assert end.finish_reason == "stop" and end.logprobs is None
    usage = {
        "prompt_tokens": 300,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 256},
    }
    assert parse_chunk({"choices": [], "usage": usage}, None).usage == Usage(300, 3, 256)
    assert parse_chunk({"error": {"message": "boom"}}, None).error == "boom"
    with pytest.raises(ChunkError):
        parse_chunk({"choices": [{"token_ids": [1]}, {"token_ids": [2]}]}, None)


def test_a_400_names_what_was_refused() -> None:
    too_long = json.dumps({"error": {"message": "This model's maximum context length is 2048"}})
    assert isinstance(rejection(too_long, False), PromptTooLong)
    assert isinstance(rejection('{"message": "invalid JSON schema"}', True), GrammarRejected)
    assert isinstance(rejection("bad logit_bias", False), RequestRejected)


METRICS = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",num_gpu_blocks="182",engine="0"} 1.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 256.0
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.7e9
"""


def test_server_facts_from_its_routes() -> None:
    m = parse_metrics(METRICS)
    assert (m.block_size, m.num_blocks, m.running, m.waiting) == (128, 182, 2, 1)
    assert (m.prefix_queries, m.prefix_hits, m.start_time) == (1000, 256, 1.7e9)
    stats = m.cache_stats()
    assert (stats.blocks_total, stats.blocks_in_use, stats.hit_tokens) == (182, 91, 256)
    assert parse_metrics("").block_size == 16  # a server that does not say: vLLM's default
    assert served_model({"data": [{"id": "smol", "max_model_len": 2048}]}) == ("smol", 2048)
    with pytest.raises(ValueError):
        served_model({"data": []})
    sources = {"0": {"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://10.0.0.2:5558"}}
    assert event_sources(sources, "http://10.0.0.2:8000") == (
        "tcp://10.0.0.2:5557",
        "tcp://10.0.0.2:5558",
    )
    assert event_sources({}, "http://h:1") is None
