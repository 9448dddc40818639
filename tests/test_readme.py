"""The README's facts are the code's: the configuration table is the one the settings declare,
the serve examples name every port ``kvgate serve`` opens, and the default model's sizes are the
pinned wheel's (they cannot drift)."""

from __future__ import annotations

import re
from pathlib import Path

from gateway.commands.default_model import GGUF_BYTES, WHEEL_BYTES, download_size, megabytes
from gateway.settings import Settings, configuration_table

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_lists_every_setting_as_declared() -> None:
    table = configuration_table().strip()
    assert table in README.read_text(), (
        "README.md's configuration table differs from gateway.settings.VARIABLES; paste "
        "`python -c 'from gateway.settings import configuration_table as t; print(t())'`"
    )


def serve_examples() -> list[str]:
    """The README's shell blocks that start a gateway (``make serve``, ``kvgate serve``)."""
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(), re.S)
    return [b for b in blocks if re.search(r"\b(make|kvgate) serve\b", b)]


def test_every_serve_example_says_it_also_opens_the_metrics_port() -> None:
    server = Settings.from_env({}).server
    metrics = f"{server.metrics_host}:{server.metrics_port}"
    examples = serve_examples()
    assert len(examples) >= 2
    for block in examples:
        assert "KVGATE_METRICS_PORT" in block and metrics in block, block


def test_the_default_models_sizes_are_the_pinned_wheels() -> None:
    text = README.read_text()
    gguf, wheel = megabytes(GGUF_BYTES), megabytes(WHEEL_BYTES)
    assert f"Q4_1 GGUF, {gguf})" in text
    assert f"(a {wheel} download)" in text
    assert f"{wheel} wheel holding the {gguf} GGUF" in download_size()  # the first start's line
