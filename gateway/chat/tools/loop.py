"""The gateway runs a tenant's tools: call, result, continue, within rounds and deadlines.

    round k (k <= max_tool_rounds)    generate with the request's tool plan
      no call, or a call of a tool without a source   -> the answer (client calls as tool_calls)
      calls of tools with a source    -> run them (concurrently, each within the call deadline
                                         and what is left of the turn's), append the results as
                                         ``tool`` turns (gateway/chat/tools/continuation.py: only
                                         their tokens are new prefill), next round
    after the last round, or past the turn's deadline: one more step with tool_choice "none"
                                      (the model answers in text)

A round whose calls mix gateway-run tools and the client's runs the former and ends with the
latter as ``tool_calls``. Every run is listed in the answer's ``kvgate_tool_runs`` (id, name,
status, duration, round) and every generation step's usage in ``kvgate_steps`` (after the
first, with ``gateway_ms``: the gateway's own time in the round before it, tools and engine
excluded); ``usage`` is their sum. Tool failures are tool messages
(gateway/chat/tools/run/runner.py), never errors. The loop holds the request's one lease and pin
reference.

What bounds a turn (docs/tools.md, "What a turn may cost")::

    completion tokens   the request's max_tokens (or the tenant's max_output_tokens) bound the
                        whole turn: each step may generate what the earlier ones left
    each later step     admitted before it runs (``StepAdmission``: the budgets and TPM reserve
                        its prompt and its most completion tokens); refused -> the turn ends
                        with what it has, finish "length" and the refusal (``LoopOutcome.error``)
    context             a step that cannot fit one more token is not run: finish "length"
    calls per round     at most KVGATE_TOOL_MAX_CALLS_PER_ROUND run; the rest are answered
                        ``tool_call_limit`` without running
    a step cut short    (finish "length", or a call the model did not close) runs none of its
                        calls: the answer ends there, finish "length"

Whatever ends the turn, even a client that went away, its usage counts every step the engine
ran (a step cut mid-way: the tokens generated until it was aborted) and ``calls_run`` every
call that started.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from engine.api import GenerateOptions
from gateway.chat.admission import Prepared
from gateway.chat.generation import ChoiceGroup, GenerationStats
from gateway.chat.kept_turn import turn_of
from gateway.chat.ledger import TOOL_CALLS
from gateway.chat.observe import RequestObserver
from gateway.chat.schemas import ChatRequest, choice_body, completion_body, usage_body
from gateway.chat.tools.answer import finish_reason
from gateway.chat.tools.continuation import next_prompt, result_text
from gateway.chat.tools.models import ToolDef
from gateway.chat.tools.parser import ToolCall, ToolCallParser
from gateway.chat.tools.plan import OutputPlan, plan_output
from gateway.chat.tools.run.runner import ToolRun, ToolRunner
from gateway.chat.tools.tenant import tenant_tool_defs
from gateway.context import GatewayState
from gateway.errors import ApiError, to_api_error
from gateway.prompts.pins import PromptEntry
from gateway.settings import ToolSettings
from tenants.runtime import TenantRuntime
from tenants.tools import TenantTool

RUNS_FIELD = "kvgate_tool_runs"  # the calls the gateway ran (documented extension field)
STEPS_FIELD = "kvgate_steps"  # the usage of each generation step of the turn
ERROR_FIELD = "kvgate_error"  # the refusal that ended a turn early (non-streamed answers)
CALL_LIMIT = "tool_call_limit"  # the status of a call over the round's cap (never run)


@dataclass(frozen=True)
class Step:
    """One generation step: its content (calls cut out), its whole text, the model's tokens,
    its calls."""

    content: str | None
    text: str
    token_ids: tuple[int, ...]
    reason: str
    calls: list[ToolCall]
    stats: GenerationStats


StepFn = Callable[[list[int], OutputPlan, int, int], Awaitable["Step"]]


class StepAdmission(Protocol):
    async def __call__(self, prompt_tokens: int, max_tokens: int) -> None:
        """Admit one later step (budgets, TPM) or raise its refusal (an ApiError, or an error
        ``to_api_error`` maps)."""


class RunHooks(Protocol):
    async def starting(self, tools: Sequence[TenantTool], calls: Sequence[ToolCall]) -> None: ...

    async def finished(self, runs: Sequence[ToolRun]) -> None: ...


@dataclass
class LoopOutcome:
    content: str | None
    tool_calls: list[dict[str, Any]] | None
    finish_reason: str
    runs: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, float]] = field(default_factory=list)
    error: ApiError | None = None  # the refusal of a later step that ended the turn


@dataclass
class ToolLoop:
    state: GatewayState
    runner: ToolRunner
    rt: TenantRuntime
    entry: PromptEntry
    body: ChatRequest
    ready: Prepared
    options: GenerateOptions
    settings: ToolSettings
    admit: StepAdmission
    started: float = field(default_factory=time.monotonic)
    calls_run: int = 0  # calls of the turn that started (the usage record's)

    def __post_init__(self) -> None:
        self._step_gen: ChoiceGroup | None = None  # the later step running now
        tok = self.state.tokenizer
        client = self.body.tools or []
        self.tools: list[ToolDef] = [*tenant_tool_defs(self.rt.tool_policy), *client]
        self.rendered = self.tools if self.ready.plan.native else client
        self.final = plan_output(self.tools, "none", None, None, tok.chat_template)
        self.server = {t.name: t for t in self.rt.tool_policy.tools if t.runs_on_gateway}

    @property
    def deadline(self) -> float:
        return self.started + self.settings.turn_timeout_s

    async def complete(self, first: ChoiceGroup) -> LoopOutcome:
        """The non-streamed loop from the first step (started by the caller)."""
        return await self.drive(await finish(first, self.ready.plan), self._step)

    async def drive(
        self, step: Step, next_step: StepFn, hooks: RunHooks | None = None
    ) -> LoopOutcome:
        """Run the loop from the first step's outcome; ``next_step`` generates each later one,
        ``hooks`` hear of each round's runs (the stream's status lines). The first step's stats
        become the sum of every step's (the request's usage), a step cut by a failure or a
        cancellation included."""
        try:
            return await self._drive(step, next_step, hooks)
        except BaseException:
            cut = self._step_gen
            if cut is not None:  # closed by its own clean-up: it counts what it generated
                _add(step.stats, cut.stats)
            raise

    async def _drive(self, step: Step, next_step: StepFn, hooks: RunHooks | None) -> LoopOutcome:
        plan, ids = self.ready.plan, list(self.ready.prompt_ids)
        total = step.stats
        out = LoopOutcome(None, None, "stop", steps=[_usage(step.stats)])
        rounds = 0
        while True:
            step_end = time.perf_counter()
            ran = [c for c in step.calls if c.name in self.server]
            client = [c for c in step.calls if c.name not in self.server]
            if plan.calls is None or not ran:
                return self._answer(out, step, client)
            if step.reason == "length" or not all(c.complete for c in ran):
                return self._cut(out, step)  # an unfinished call never runs
            rounds += 1
            runs, tools_s = await self._round(ran, hooks)
            out.runs += [{**r.body(), "round": rounds} for r in runs]
            if client:
                return self._answer(out, step, client)
            results = [(r.call_id, result_text(self.state.tokenizer, r.content)) for r in runs]
            ids = self._next_ids(ids, step, results)
            last = rounds >= self.rt.tool_policy.max_rounds or time.monotonic() >= self.deadline
            plan = self.final if last else self.ready.plan
            ids = plan.opened(ids, self.state.tokenizer)  # a primed call's opening
            max_tokens = self._room(ids, total)
            if max_tokens < 1:  # the turn's tokens are spent, or the context is full
                return self._cut(out, None)
            try:
                await self.admit(len(ids), max_tokens)
            except Exception as exc:
                out.error = _refusal(exc)
                return self._cut(out, None)
            # the gateway's own time in this round: all but the tools and the engine
            gateway_s = time.perf_counter() - step_end - tools_s
            step = await next_step(ids, plan, rounds, max_tokens)
            self._step_gen = None
            _add(total, step.stats)
            out.steps.append({**_usage(step.stats), "gateway_ms": round(gateway_s * 1000, 3)})

    async def _round(
        self, calls: list[ToolCall], hooks: RunHooks | None
    ) -> tuple[list[ToolRun], float]:
        """Run a round's calls (at most the cap; the rest answered ``tool_call_limit``); the
        runs and the seconds the tools took."""
        run, over = capped(calls, self.settings.max_calls_per_round)
        self.calls_run += len(run)
        if hooks is not None:
            await hooks.starting([self.server[c.name] for c in run], run)
        started = time.perf_counter()
        runs = await self._run(run)
        tools_s = time.perf_counter() - started
        runs += over
        if hooks is not None:
            await hooks.finished(runs)
        return runs, tools_s

    def _room(self, ids: list[int], total: GenerationStats) -> int:
        """The most tokens the next step may generate: what the turn has left, within the
        context (one position kept, as for the first step)."""
        left = self.ready.params.max_tokens - total.completion_tokens
        room = self.state.engine.info.max_model_len - len(ids) - 1
        return min(left, room)

    def _cut(self, out: LoopOutcome, step: Step | None) -> LoopOutcome:
        """The turn ends before it is done: finish "length" with the content so far (a cut
        step's content; after a round of runs, none)."""
        out.content = step.content if step is not None else None
        out.tool_calls = None
        out.finish_reason = "length"
        return out

    def _answer(self, out: LoopOutcome, step: Step, client: list[ToolCall]) -> LoopOutcome:
        calls = [c.body() for c in client] or None
        out.content = step.content if step.content or calls is None else None
        out.tool_calls = calls
        out.finish_reason = finish_reason(step.reason, calls is not None)
        return out

    async def _run(self, calls: Sequence[ToolCall]) -> list[ToolRun]:
        left = self.deadline - time.monotonic()
        timeout = max(0.0, min(self.settings.timeout_s, left))
        tid = self.rt.tenant_id
        jobs = [self._one(tid, self.server[c.name], c, timeout) for c in calls]
        return list(await asyncio.gather(*jobs))

    async def _one(self, tid: str, tool: TenantTool, call: ToolCall, timeout: float) -> ToolRun:
        if timeout <= 0:
            content = '{"error": "tool_timeout", "message": "the turn ran out of time"}'
            return ToolRun(call.id, call.name, "tool_timeout", content, 0.0)
        return await self.runner.run(tid, tool, call.id, call.arguments or "{}", timeout)

    def _next_ids(self, ids: list[int], step: Step, results: list[tuple[str, str]]) -> list[int]:
        return next_prompt(
            self.state.tokenizer,
            self.entry.prefix,
            self.ready.plan,
            self.body.messages,
            self.rendered,
            ids,
            step.token_ids,
            step.text,
            results,
        )

    def group(
        self, ids: list[int], plan: OutputPlan, round_: int, max_tokens: int, streamed: bool
    ) -> ChoiceGroup:
        """The engine request of step ``round_`` (after that many rounds of runs), admitted
        for ``max_tokens``; the loop counts it until it ends, whatever ends it."""
        params = dataclasses.replace(self.ready.params, grammar=plan.grammar, max_tokens=max_tokens)
        rid = f"{self.options.request_id}-t{round_}"
        self._step_gen = ChoiceGroup(
            self.state.engine,
            self.state.tokenizer,
            ids,
            params,
            dataclasses.replace(self.options, request_id=rid),
            n=1,
            stops=self.body.stop_strings,
            streamed=streamed,
        )
        return self._step_gen

    async def _step(self, ids: list[int], plan: OutputPlan, round_: int, max_tokens: int) -> Step:
        gen = self.group(ids, plan, round_, max_tokens, streamed=False)
        try:
            await gen.start()
            return await finish(gen, plan)
        finally:
            await gen.close()


async def finish(gen: ChoiceGroup, plan: OutputPlan) -> Step:
    """A non-streamed step's outcome."""
    (result,) = await gen.results()
    calls: list[ToolCall] = []
    content: str | None = result.text
    if plan.calls is not None:
        parser = ToolCallParser(plan.calls)
        parser.feed(result.text)
        parser.close()
        calls, content = list(parser.calls), parser.content
    return step_of(gen, content, result.text, result.finish_reason, calls)


def step_of(
    gen: ChoiceGroup, content: str | None, text: str, reason: str, calls: list[ToolCall]
) -> Step:
    choice = gen.choices[0]
    return Step(content, text, tuple(choice.token_ids), reason, calls, choice.stats)


def _refusal(exc: Exception) -> ApiError:
    """A later step's refusal as the answer's error; anything else is not a refusal."""
    err = exc if isinstance(exc, ApiError) else to_api_error(exc)
    if err is None:
        raise exc
    return err


def capped(calls: list[ToolCall], cap: int) -> tuple[list[ToolCall], list[ToolRun]]:
    """The calls of a round that run (the first ``cap``) and the answers of the rest, which
    never run: ``tool_call_limit``, so the model reads why."""
    message = f"at most {cap} tool calls run in one round"
    content = json.dumps({"error": CALL_LIMIT, "message": message})
    return calls[:cap], [ToolRun(c.id, c.name, CALL_LIMIT, content, 0.0) for c in calls[cap:]]


def _usage(s: GenerationStats) -> dict[str, float]:
    return {
        "prompt_tokens": s.prompt_tokens,
        "cached_tokens": s.cached_tokens,
        "completion_tokens": s.completion_tokens,
    }


def _add(total: GenerationStats, s: GenerationStats) -> None:
    total.prompt_tokens += s.prompt_tokens
    total.completion_tokens += s.completion_tokens
    total.cached_tokens += s.cached_tokens
    total.finish_reason = s.finish_reason
    total.last_token_at = s.last_token_at


def tool_loop(
    state: GatewayState,
    runner: ToolRunner | None,
    rt: TenantRuntime,
    entry: PromptEntry,
    body: ChatRequest,
    ready: Prepared,
    options: GenerateOptions,
    settings: ToolSettings,
    admit: StepAdmission,
) -> ToolLoop | None:
    """The loop of a request (``runner``: the gateway's, TOOL_RUNNER), or None when the
    gateway runs none of its calls."""
    policy = rt.tool_policy
    runs_tools = any(t.runs_on_gateway for t in policy.tools) and policy.max_rounds > 0
    if runner is None or not runs_tools or ready.plan.calls is None or body.num_choices != 1:
        return None
    return ToolLoop(state, runner, rt, entry, body, ready, options, settings, admit)


async def respond(
    request: web.Request,
    loop: ToolLoop,
    gen: ChoiceGroup,
    rid: str,
    headers: dict[str, str],
    obs: RequestObserver,
) -> web.Response:
    """The non-streamed answer of a request whose tools the gateway runs; a turn a refusal
    ended early is a 200 with what it has, finish "length" and the refusal in ``kvgate_error``
    (a retry would run its tools again)."""
    try:
        out = await loop.complete(gen)
    finally:
        request[TOOL_CALLS] = loop.calls_run  # the usage record's, however the turn ends
    stats = gen.stats  # every step's sum
    stats.finish_reason = out.finish_reason  # "tool_calls" in the log and span
    choice = choice_body(0, out.content, out.finish_reason, None, out.tool_calls)
    usage = usage_body(stats.prompt_tokens, stats.completion_tokens, stats.cached_tokens)
    doc = completion_body(rid, loop.body.model, [choice], usage)
    doc[RUNS_FIELD], doc[STEPS_FIELD] = out.runs, out.steps
    if out.error is not None:
        doc[ERROR_FIELD] = out.error.body()["error"]
        obs.stream_error = out.error.code or out.error.type
    turn = turn_of(request)
    if turn is not None and out.error is None:  # the widget's history: kept before the answer
        turn.add(out.content or "")
        await turn.save(loop.body.model, stats, rid)
    resp = web.json_response(doc, headers=headers)
    await resp.prepare(request)
    await resp.write_eof()
    obs.delivered = True
    return resp
