"""The cluster over two real vLLM servers follows their KV events: a prompt computed on one
server is routed back to it, a placed prompt is prewarmed where it is placed, and a prompt whose
blocks a server dropped is warmed again."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from engine.api import GenerateOptions
from engine.params import SamplingParams
from engine.remote.keys import reusable_block_keys
from engine.remote.messages import Removed
from engine.remote.vllm_client import VllmClient
from engine.remote.vllm_wire import vllm_salt
from gateway.cluster.engine import ClusterEngine
from gateway.cluster.vllm import VllmSource
from gateway.settings import Settings
from tests.vllm.conftest import API_KEY, VllmPair
from tests.vllm.probes import BLOCK, async_client, random_ids
from tests.vllm.servers import MODEL_NAME, VllmServer

GREEDY = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
WAIT_S = 120.0  # a prefill on a busy 2-core machine, then its events


@pytest.fixture
async def cluster(
    vllm_pair: VllmPair, vllm_model: Path, tmp_path: Path
) -> AsyncIterator[ClusterEngine]:
    servers = vllm_pair.servers
    env = {
        "KVGATE_BACKEND": "vllm",
        "KVGATE_WORKERS": ",".join(s.base_url for s in servers),
        "KVGATE_WORKER_TOKEN": API_KEY,
        "KVGATE_MODEL": str(vllm_model),
        "KVGATE_WORKER_HEALTH_S": "0.5",
        "KVGATE_VAR_DIR": str(tmp_path),
    }  # no KVGATE_KV_EVENTS: each server's GET /kv_event_sources names its publisher
    eng = await VllmSource.from_settings(Settings.from_env(env), str(vllm_model)).open_cluster()
    await eng.start()
    try:
        yield eng
    finally:
        await eng.shutdown()


async def held_by(eng: ClusterEngine, ns: str, prompt: list[int], blocks: int) -> frozenset[str]:
    """The servers the cluster's index says hold ``blocks`` blocks of the prompt, once it does."""
    salt = vllm_salt(ns, None)  # what the cluster sends vLLM, and what its events carry
    async with asyncio.timeout(WAIT_S):
        while True:
            n, holders = eng.index.longest(salt, prompt, BLOCK)
            if n >= blocks:
                return holders
            await asyncio.sleep(0.1)


async def test_routing_follows_the_kv_events_of_each_server(
    cluster: ClusterEngine, vllm_pair: VllmPair
) -> None:
    for server in vllm_pair.servers:
        ns = "route-" + secrets.token_hex(8)
        prompt = random_ids(2 * BLOCK + 10)
        # computed on this server alone, straight to it (never through the cluster)
        c = async_client(server, API_KEY)
        await c.completions.create(
            model=MODEL_NAME,
            prompt=prompt,
            max_tokens=1,
            extra_body={"cache_salt": vllm_salt(ns, None)},
        )
        assert await held_by(cluster, ns, prompt, 2) == {server.base_url}
        outs = [
            o
            async for o in cluster.generate(
                [*prompt, *random_ids(5)], GREEDY, GenerateOptions(namespace=ns)
            )
        ]
        assert outs[0].worker == server.base_url
        assert outs[-1].finished and outs[-1].num_cached_tokens == 2 * BLOCK
        assert cluster.members[server.base_url].routed["affinity"] >= 1
    cluster.check_integrity()


async def test_a_placed_prompt_is_prewarmed_where_it_is_placed(cluster: ClusterEngine) -> None:
    ns = "placed-" + secrets.token_hex(8)
    prompt = random_ids(3 * BLOCK + 7)
    pin = await cluster.pin("tenant-p", ns, prompt)
    placed = set(cluster.placer.placement.workers_of(pin.key))
    assert placed and set(pin.workers(cluster.healthy())) == placed
    assert await held_by(cluster, ns, prompt, 3) >= placed  # the events of the prewarm
    outs = [o async for o in cluster.generate([*prompt, 1, 2, 3], GREEDY, GenerateOptions(ns))]
    assert outs[0].worker in placed and outs[-1].num_cached_tokens == 3 * BLOCK
    await cluster.unpin(pin)


async def test_a_prompt_whose_blocks_left_is_warmed_again(
    vllm_server: VllmServer, vllm_model: Path
) -> None:
    """The server's removal of a kept prompt's block (as its events would say it after an
    eviction: a server of this size needs minutes of prefill to evict) warms it again once its
    tenant has had a request there (vllm_rewarm.py)."""
    import aiohttp

    async with aiohttp.ClientSession() as http:
        client = VllmClient(vllm_server.base_url, API_KEY, http)
        ns = "rewarm-" + secrets.token_hex(8)
        prompt = random_ids(2 * BLOCK + 3)
        handle = await client.pin(ns, prompt)
        assert handle.num_tokens == 2 * BLOCK and client.rewarms == 0
        key = reusable_block_keys(vllm_salt(ns, None), prompt, BLOCK)[1].hex()
        client.rewarm_after([Removed(key)])  # no request of the tenant yet: not warmed
        await client.rewarmer.idle()
        assert client.rewarms == 0
        outs = [o async for o in client.generate([*prompt, 7], GREEDY, GenerateOptions(ns))]
        assert outs[-1].num_cached_tokens == 2 * BLOCK
        client.rewarm_after([Removed(key)])  # a recent tenant, an idle server: warmed again
        await client.rewarmer.idle()
        assert client.rewarms == 1
        client.rewarm_after([Removed("00" * 16)])  # another prompt's block: nothing
        await client.rewarmer.idle()
        assert client.rewarms == 1
        await client.unpin(handle)
        await client.close()
