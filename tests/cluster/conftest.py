from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.cluster.local import LocalWorker
from tests.cluster.workers import start_workers, stop_workers


@pytest.fixture(scope="session")
def demo_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine.runtime.model.demo import write_demo_model

    return write_demo_model(tmp_path_factory.mktemp("demo-model"))


@pytest.fixture(scope="session")
def three_workers(demo_model_dir: Path) -> Iterator[list[LocalWorker]]:
    workers = start_workers(demo_model_dir, ["w0", "w1", "w2"])
    yield workers
    stop_workers(workers)
