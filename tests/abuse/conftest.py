"""Fixtures of the abuse suite (the gateway tests' model and template database, the real
default model of the e2e tests)."""

from tests.e2e.conftest import default_gguf  # noqa: F401  (shared fixtures)
from tests.gateway.conftest import (  # noqa: F401
    demo_model_dir,
    template_database,
)
