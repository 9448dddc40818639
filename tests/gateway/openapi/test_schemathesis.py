"""Contract test: schemathesis against a live gateway (loopback, demo model, PostgreSQL).

Cases are generated from the served /openapi.json for every operation (chat and admin), then a
stateful run follows the document's links (create a tenant -> its prompts, keys, limits...).
Every answer must be no 5xx and conform to the document: documented status, content type,
headers and body schema. The number of cases sent is checked (>= 500). Chat cases with tools,
tool choices and response formats are drawn on top of the generated ones
(tests/gateway/structured_cases.py): some of their answers must hold tool calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hypothesis
import hypothesis.errors
import hypothesis.strategies as st
import requests
import schemathesis
from hypothesis import HealthCheck
from schemathesis import Case
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.gateway.harness import ADMIN_TOKEN, live_gateway, make_settings
from tests.gateway.structured_cases import run_structured
from tests.tenants.fixtures import clear_tables

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
MIN_CASES = 500
CHAT_EXAMPLES = 150  # the chat operation has the largest input space
STRUCTURED_EXAMPLES = 40  # chat cases with tools and response formats (structured_cases.py)
EXAMPLES_PER_OPERATION = 25
STATEFUL_RUNS, STATEFUL_STEPS = 25, 8
MAX_INT = 2**31 - 1
LIMITS = {"rpm": MAX_INT, "tpm": MAX_INT, "max_concurrency": 64, "max_output_tokens": 4}


class Suite:
    """Sends cases with the right bearer token and validates every answer; counts them."""

    def __init__(
        self, base_url: str, tenant_key: str, model: str, reset: Callable[[], None]
    ) -> None:
        self.base_url = base_url
        self.reset = reset  # empties the tenant store (before each stateful scenario)
        self.tenant_key = tenant_key
        self.model = model
        self.http = requests.Session()
        self.cases = 0
        self.statuses: dict[int, int] = {}
        self.failures: list[str] = []

    def authorize(self, case: Case) -> dict[str, str]:
        """The real token of the operation's scheme, in place of the generated one."""
        token = ADMIN_TOKEN if case.path.startswith("/admin/") else self.tenant_key
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {token}"}
        return case.headers

    def validate(self, case: Case, response: Any) -> None:
        """Failures are collected, not raised: the server's state moves on, so hypothesis could
        not replay a case to shrink it (and a stateful run would report flaky generation)."""
        self.cases += 1
        self.statuses[response.status_code] = self.statuses.get(response.status_code, 0) + 1
        try:
            case.validate_response(response, checks=CHECKS, headers=case.headers)
        except Exception as exc:  # schemathesis' FailureGroup of the failed checks
            self.failures.append(f"{case.method} {case.formatted_path}: {exc}")

    def check(self, case: Case) -> None:
        self.authorize(case)
        self.validate(case, case.call(base_url=self.base_url, session=self.http))

    def with_served_model(self, strategy: Any) -> Any:
        """Chat cases name the served model most of the time (any other id is a 404), so that
        generation, streaming and the limiter are exercised, not only the model check."""

        def pick(pair: tuple[Case, bool]) -> Case:
            case, served = pair
            if served and isinstance(case.body, dict):
                case.body["model"] = self.model
            return case

        return st.tuples(strategy, st.integers(0, 9).map(lambda n: n < 8)).map(pick)


def _settings(max_examples: int, **kw: Any) -> hypothesis.settings:
    return hypothesis.settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
        suppress_health_check=list(HealthCheck),
        **kw,
    )


def run_operations(schema: Any, suite: Suite) -> None:
    for result in schema.get_all_operations():
        operation = result.ok()
        strategy = operation.as_strategy()
        examples = EXAMPLES_PER_OPERATION
        if operation.path == "/v1/chat/completions":
            strategy, examples = suite.with_served_model(strategy), CHAT_EXAMPLES

        @_settings(examples)
        @hypothesis.given(case=strategy)
        def run(case: Case) -> None:
            suite.check(case)

        run()


def run_stateful(schema: Any, suite: Suite) -> None:
    base: Any = schema.as_state_machine()

    class Workflow(base):  # type: ignore[misc, valid-type]
        def setup(self) -> None:
            # Each scenario starts from an empty store, so that the answers a scenario gets
            # (and with them the rules hypothesis can draw) depend only on its own steps.
            suite.reset()

        def before_call(self, case: Case) -> None:
            suite.authorize(case)

        def get_call_kwargs(self, case: Case) -> dict[str, Any]:
            return {"base_url": suite.base_url, "session": suite.http}

        def validate_response(self, response: Any, case: Case, **kwargs: Any) -> None:
            suite.validate(case, response)

    before = suite.cases
    try:
        Workflow.run(settings=_settings(STATEFUL_RUNS, stateful_step_count=STATEFUL_STEPS))
    except hypothesis.errors.FlakyStrategyDefinition as exc:
        # Hypothesis replays a scenario's choices and finds another operation drawn: a rule's
        # availability followed an answer that differed between the two runs (seen on some
        # hosts, not yet traced). Every answer it got was still validated; a scenario that
        # stopped here is not a failure of the gateway.
        print(f"schemathesis: stateful phase stopped by hypothesis: {str(exc).splitlines()[0]}")
    assert suite.cases - before >= STATEFUL_STEPS, "the stateful phase ran no scenario"


def run_all(document: dict[str, Any], suite: Suite, *parts: Callable[[Any, Suite], None]) -> None:
    schema = schemathesis.openapi.from_dict(document)
    for part in parts:
        part(schema, suite)


async def test_schemathesis_contract(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(gateway_database, tmp_path)
    async with live_gateway(settings, demo_model_dir) as gw:
        tenant = await gw.create_tenant("contract", system_prompt="Be brief.", limits=LIMITS)
        async with gw.http.get(f"{gw.base_url}/openapi.json") as resp:
            document = await resp.json()
        loop = asyncio.get_running_loop()

        def reset() -> None:  # from the client thread, on the gateway's loop
            asyncio.run_coroutine_threadsafe(clear_tables(gw.state.store), loop).result()

        tools = await gw.create_tenant("tools", limits={**LIMITS, "max_output_tokens": 48})
        suite = Suite(gw.base_url, tenant.key, gw.state.model_name, reset)
        called: list[int] = []

        def structured(schema: Any, suite: Suite) -> None:
            called.append(run_structured(schema, suite, STRUCTURED_EXAMPLES, tools.key))

        # The synchronous client runs in a thread; the gateway keeps serving on this loop.
        parts = (structured, run_operations, run_stateful)
        await asyncio.to_thread(run_all, document, suite, *parts)
    print(f"schemathesis: {suite.cases} cases, statuses {sorted(suite.statuses.items())}")
    assert not suite.failures, "\n\n".join(suite.failures[:10])
    assert suite.cases >= MIN_CASES
    assert called[0] >= 5  # answers with tool calls were checked against the document
