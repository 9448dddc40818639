"""The engine side of the abuse suite: one hostile request never slows everyone's steps.

The engine serves the real default model (SmolLM2-135M-Instruct, the one `kvgate serve` runs,
fetched once by the e2e fixture). Its batch holds four other tenants' decoding requests and one
companion request; the companion is either a plain chat request or the most expensive one a
widget key may send (tests/abuse/hostile.py: 300 logit_bias entries, 20 top logprobs, every
penalty, top-k / top-p / min-p, a 64-bit seed), both turned into engine parameters by the
gateway's own admission code. Steps are timed in the engine thread's CPU time (what the batch
costs, whoever else uses the machine), interleaved over rounds, lower quartiles compared: the
hostile companion may add at most 10% to a step. The figures are printed (``-s``).
"""

from __future__ import annotations

import gzip
import json
import random
import statistics
import time
from pathlib import Path

import pytest
import torch

from engine.params import SamplingParams
from engine.serving.engine import Engine
from gateway.chat.admission import sampling_params
from gateway.chat.schemas import parse_chat_request
from gateway.commands.default_model import SAMPLING_DEFAULTS
from gateway.settings import Settings
from tests.abuse.hostile import Hostile, catalogue, chat, encode

ROUNDS = 4
STEPS = 12  # timed decode steps per round and companion
OTHERS = 4  # other tenants' requests decoding beside the companion
MAX_ADDED = 0.10


def params_of(h: Hostile, vocab_size: int) -> SamplingParams:
    """What the gateway sends the engine for ``h`` (the default model's sampling defaults)."""
    raw = gzip.decompress(h.body) if h.headers.get("Content-Encoding") == "gzip" else h.body
    body = parse_chat_request(raw)
    model = Settings.from_env({**SAMPLING_DEFAULTS, "KVGATE_DEFAULT_MAX_TOKENS": "64"}).model
    return sampling_params(body, 8 + ROUNDS * STEPS, model, vocab_size)


def step_times(eng: Engine, companion: SamplingParams, rng: random.Random) -> list[float]:
    other = SamplingParams(max_tokens=4 + STEPS, temperature=0.7, top_p=0.9, seed=1)
    prompts = [[rng.randrange(100, 40_000) for _ in range(48)] for _ in range(OTHERS + 1)]
    ids = [eng.add_request(p, other, namespace=f"tenant-{i}") for i, p in enumerate(prompts[1:])]
    ids.append(eng.add_request(prompts[0], companion, namespace="attacker"))
    for _ in range(2):  # prefill, then one decode step off the clock
        eng.step()
    times = []
    for _ in range(STEPS):
        start = time.thread_time()
        eng.step()
        times.append(time.thread_time() - start)
    for rid in ids:
        eng.abort(rid)
    while eng.has_unfinished():
        eng.step()
    return times


@pytest.mark.timeout(600)
def test_one_hostile_request_adds_at_most_a_tenth_to_a_step(default_gguf: Path) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: CPU time is the step's whole cost
    try:
        eng = Engine.from_pretrained(default_gguf, device="cpu", kv_cache_bytes=64 << 20)
        vocab = eng.tokenizer.vocab_size
        hostile = next(h for h in catalogue("m", "t") if h.name == "bias_max_with_everything")
        plain = Hostile(
            "plain", encode(chat("m", "where is my order?", max_tokens=8)), hostile.expect
        )
        companions = {"plain": params_of(plain, vocab), "hostile": params_of(hostile, vocab)}
        assert companions["hostile"].logit_bias and companions["hostile"].logprobs == 20
        rng, times = random.Random(0), {name: [] for name in companions}
        for _ in range(ROUNDS):
            for name, params in companions.items():
                times[name] += step_times(eng, params, rng)
    finally:
        torch.set_num_threads(threads)
    # the lower quartile: noise on a shared machine only ever adds time to a step
    plain_s, hostile_s = (statistics.quantiles(times[k], n=4)[0] for k in ("plain", "hostile"))
    fastest = {k: round(min(v) * 1e3, 2) for k, v in times.items()}
    print(
        f"\nstep CPU time, lower quartile of {ROUNDS * STEPS}: with a plain companion "
        f"{plain_s * 1e3:.1f} ms, with the hostile one {hostile_s * 1e3:.1f} ms "
        f"({hostile_s / plain_s:.3f}x); min {json.dumps(fastest)} ms"
    )
    assert hostile_s <= (1 + MAX_ADDED) * plain_s, (hostile_s, plain_s)
