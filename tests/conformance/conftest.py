from tests.gateway.conftest import (  # noqa: F401  (shared fixtures)
    demo_model_dir,
    template_database,
)
