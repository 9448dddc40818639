"""Continuous batching with chunked prefill, early prefix reuse and preemption (no torch).

One step is ``schedule() -> runner.execute(batch) -> update(batch, sampled)``. ``schedule`` fills
a token budget (``max_num_batched_tokens``) in two passes:

1. running requests, oldest admission first: one decode token each, or the next prefill chunk;
2. waiting requests (FIFO) are admitted while the budget, ``max_num_seqs`` and the KV pool allow.
   Admission calls ``cache.allocate`` for the whole prompt: the cached prefix (READY or PENDING
   blocks) counts as computed, only the rest is scheduled.

Early reuse: a request attached to PENDING blocks (another request is computing them) may run in
a step only if every such owner is scheduled *earlier in the same step* with a chunk reaching the
token end it needs (or has committed it already). The runner writes each layer's new K/V before
that layer's attention reads, so a dependent and its owner share one forward. Owners are always
admitted before their dependents, so the dependency graph follows admission order and the oldest
running request can always run: no deadlock, no idle step waiting for a prefix.

Host tier: a block restored from host memory is LOADING until its copy runs. The engine performs
every copy the cache planned during ``schedule()`` before that step's forward, so a request reading
LOADING blocks runs in the same step, like a dependent of an owner scheduled before it (no idle
wait, no recompute); ``pending_deps`` reports no owner for them.

Out of blocks while growing a running request: preempt the most recently admitted running request
(free its blocks, re-queue it at the head of ``waiting`` for recompute; READY blocks stay cached).

``scheduling="fair"`` (the default; engine/core/fairness.py) changes five choices and nothing
else: admission takes the head request of the tenant with the lowest virtual token counter
(interactive before batch, aged batch first) instead of the queue's head; the budget of a step is
split by counter over every claim on it (``plan_step``): running decodes, running prefill chunks
and the waiting requests free slots could admit, so a tenant's decodes wait when the budget is
short and others are behind (the step itself still runs them in admission order: early reuse
needs owners first); while an under-served tenant waits, the others get at most
``fair_prefill_tokens`` of prefill (and, where set, ``fair_decode_rows`` decode rows) in the
step, so the waiting request is admitted and computed in this short step; when every slot
(``max_num_seqs``) is taken and a waiting tenant is behind the most served running one by more
than both requests cost, one request of the latter is preempted for it (``slot_victim``: slots
follow the counters, not only finishing requests); and blocks are grown least served first, so
the victim of a KV preemption is the running request of a batch class / the highest counter /
the newest admission, in that order. The counters charge what each scheduled chunk costs the
model (``cost``: tokens, the keys they attend to, sampling; engine/core/step_cost.py), so a
decode over a long cached context weighs what it takes, not one token.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from engine.config import EngineConfig
from engine.core.batch import FinalToken, Sampled, ScheduledBatch, ScheduledSeq
from engine.core.fair_policy import FairPolicy
from engine.core.fairness import FairShare
from engine.core.kv import Allocation, Handoff, PrefixCache, PriorityRange
from engine.core.request import Request, RequestStatus
from engine.core.sched_integrity import check_scheduler
from engine.core.step_cost import StepCost
from engine.errors import GrammarRejected, PromptTooLong
from engine.outputs import FinishReason, RequestOutput, TokenLogprob

# Cache retention priority of generated tokens (system prompts come in higher, default is 35):
# decode blocks are unlikely to be shared, so they are evicted first.
DECODE_PRIORITY = 10


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        cache: PrefixCache,
        *,
        max_model_len: int,
        eos_token_ids: Iterable[int] = (),
        clock: Callable[[], float] = time.monotonic,
        cost: StepCost | None = None,
    ) -> None:
        """``cost``: what a chunk costs the model (the runner's geometry); None counts tokens."""
        self.config = config
        self.cache = cache
        self.block_size = config.block_size
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.clock = clock
        self.num_blocks = cache.num_blocks
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # sorted by admit_seq (oldest first)
        self.requests: dict[str, Request] = {}  # every unfinished request
        self._admit_counter = itertools.count()
        self._outputs: list[RequestOutput] = []  # produced outside update(); drained by it
        self.num_preemptions = 0
        # counted under both policies (reports); used by "fair"
        self.fair = FairShare(cost=cost or StepCost())
        self.is_fair = config.scheduling == "fair"
        self.policy = FairPolicy(config, self.fair)
        self.num_steps = 0

    # ------------------------------------------------------------------ requests in / out

    def check_fits(self, num_prompt_tokens: int, max_tokens: int) -> None:
        """Raise PromptTooLong if a request of this shape can never run."""
        total = num_prompt_tokens + max_tokens
        if num_prompt_tokens < 1:
            raise PromptTooLong("the prompt is empty", param="messages")
        if total > self.max_model_len:
            raise PromptTooLong(
                f"prompt ({num_prompt_tokens} tokens) + max_tokens ({max_tokens}) = {total} "
                f"exceeds the model's context length {self.max_model_len}",
                param="max_tokens" if num_prompt_tokens < self.max_model_len else "messages",
            )
        # The last sampled token never goes through the model, so it needs no KV slot.
        need = cdiv(total - 1, self.block_size)
        if need > self.num_blocks:
            raise PromptTooLong(
                f"prompt + max_tokens needs {need} KV blocks; the pool has {self.num_blocks}",
                param="max_tokens",
            )

    def add_request(self, req: Request) -> None:
        """Check and queue ``req`` (PromptTooLong, ValueError for what can never run)."""
        self.check_fits(req.num_prompt_tokens, req.sampling.max_tokens)
        for rng in req.priorities:
            rng.check()  # ValueError now rather than inside a later allocate()
        self.enqueue(req)

    def enqueue(self, req: Request) -> None:
        """Queue ``req``, checked by its caller (``EngineCore.check_request``: once, where the
        request is accepted)."""
        if req.request_id in self.requests:
            raise ValueError(f"request id {req.request_id!r} is already in flight")
        self.fair.arrive(req.tenant, req.weight)  # ValueError for a weight <= 0
        self.requests[req.request_id] = req
        req.enqueued_step = self.num_steps
        self.waiting.append(req)

    def abort(self, request_id: str) -> RequestOutput | None:
        """Finish a request as "abort"; its blocks are freed now. None if it is not in flight."""
        req = self.requests.get(request_id)
        if req is None:
            return None
        if req.status is RequestStatus.WAITING:
            self.waiting.remove(req)
        self._finish(req, "abort")
        return req.make_output()

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    # ------------------------------------------------------------------ schedule

    def schedule(self) -> ScheduledBatch:
        self.num_steps += 1
        budget = self.config.max_num_batched_tokens
        scheduled: dict[str, int] = {}  # request id -> token end computed by this step
        seqs: list[ScheduledSeq] = []
        now = self.clock()
        under: set[str] | None = None
        cap, allow = budget, None
        if self.is_fair:  # allow: each running request's planned share of the step
            under, cap, allow = self._fair_step(budget)
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            i += 1
            if not self._deps_ready(req, scheduled):
                continue
            num_new = min(req.num_tokens - req.num_computed, budget)
            if allow is not None:  # fair: the planned share (a decode may have to wait too)
                num_new = min(num_new, allow.get(req.request_id, 0))
                if num_new < 1:
                    continue
            if not self._grow(req, scheduled):
                continue  # req itself was preempted (it was the newest running request)
            seqs.append(self._make_seq(req, num_new, scheduled, now))
            budget -= num_new
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self._next_waiting()
            alloc = self.cache.allocate(
                req.request_id,
                req.namespace,
                req.all_token_ids,
                self._priorities(req),
                scope=req.cache_scope,
            )
            if alloc is None:
                if self.running:
                    break  # FIFO: wait for running requests to free blocks
                self._reject_unfittable(req)
                continue
            self._admit(req, alloc)
            if not self._deps_ready(req, scheduled):
                continue
            num_new = min(req.num_tokens - req.num_computed, budget)
            if under and req.tenant not in under:
                num_new = min(num_new, cap)
                if num_new < 1:
                    continue  # admitted; it computes in a later step
                cap -= num_new
            seqs.append(self._make_seq(req, num_new, scheduled, now))
            budget -= num_new
        if allow is not None and budget > 0 and (not under or not seqs):
            self._fill(budget, scheduled, seqs, now)
        return ScheduledBatch(tuple(seqs))

    def _fill(
        self, budget: int, scheduled: dict[str, int], seqs: list[ScheduledSeq], now: float
    ) -> None:
        """Fair: budget the plan left unused (a planned request waiting on an owner's prefix)
        goes to the running requests not yet in the step, oldest first, as FCFS would give it:
        work conserving, and never an idle step while something can run. Not while an
        under-served tenant waits (the step stays small for it), unless the step is empty."""
        for req in self.running:
            if budget <= 0:
                return
            if req.request_id in scheduled or not self._deps_ready(req, scheduled):
                continue
            num_new = min(req.num_tokens - req.num_computed, budget)
            seqs.append(self._make_seq(req, num_new, scheduled, now))
            budget -= num_new

    def _next_waiting(self) -> Request:
        if not self.is_fair:
            return self.waiting[0]
        return self.policy.next_waiting(self.waiting, self.num_steps)

    def _fair_step(self, budget: int) -> tuple[set[str] | None, int, dict[str, int]]:
        """Fair, before anything is scheduled: a slot moves to a tenant far behind
        (``FairPolicy.slot_to_move``), every running request gets its blocks least served
        first, and the budget is planned: (under-served tenants, prefill cap, shares)."""
        policy, step = self.policy, self.num_steps
        victim = policy.slot_to_move(self.running, self.waiting, step)
        if victim is not None:
            self._preempt(victim, {})
        under, cap = policy.limits(self.running, self.waiting, step)
        for req in policy.growth_order(self.running):
            if req.status is RequestStatus.RUNNING:
                self._grow(req, {})
        allow, cap = policy.plan(self.running, self.waiting, step, budget, under, cap)
        return under, cap, allow

    def _deps_ready(self, req: Request, scheduled: dict[str, int]) -> bool:
        """May req run now? Every owner of a PENDING block it reads must reach the end it needs
        in this step, scheduled before req (owners are older, so they were visited first)."""
        if not req.may_have_deps:
            return True
        deps = self.cache.pending_deps(req.request_id)
        if not deps:
            req.may_have_deps = False
            return True
        return all(scheduled.get(owner, -1) >= end for owner, end in deps.items())

    def _priorities(self, req: Request) -> tuple[PriorityRange, ...]:
        decode = PriorityRange(req.num_prompt_tokens, None, DECODE_PRIORITY)
        return (*req.priorities, decode)

    def _grow(self, req: Request, scheduled: dict[str, int]) -> bool:
        """Make req's block table cover all its tokens, preempting the newest running requests
        when the pool is short. False when req itself had to be preempted."""
        if len(req.block_table) * self.block_size >= req.num_tokens:
            return True
        while True:
            # No priorities, no scope: the cache keeps those given at admission.
            alloc = self.cache.allocate(req.request_id, req.namespace, req.all_token_ids)
            if alloc is not None:
                req.block_table = alloc.block_table
                return True
            victim = self._victim(scheduled)
            assert victim.request_id not in scheduled, "preemption victim already scheduled"
            self._preempt(victim, scheduled)
            if victim is req:
                return False

    def _victim(self, scheduled: dict[str, int]) -> Request:
        if not self.is_fair:
            return self.running[-1]
        return self.policy.victim(r for r in self.running if r.request_id not in scheduled)

    def _admit(self, req: Request, alloc: Allocation) -> None:
        """req got its table (cached prefix attached, prompt allocated): it joins running."""
        self.waiting.remove(req)
        self.fair.admitted(req.tenant)
        req.status = RequestStatus.RUNNING
        req.admit_seq = next(self._admit_counter)
        req.block_table = alloc.block_table
        req.num_computed = alloc.num_cached_tokens
        req.may_have_deps = any(owner is not None for owner in alloc.match.owners)
        if req.num_cached_tokens is None:
            req.num_cached_tokens = alloc.num_cached_tokens
        self.running.append(req)  # admit_seq grows: running stays in admission order

    def _reject_unfittable(self, req: Request) -> None:
        """Nothing else holds blocks: only pins and the pool size stand in the way, and neither
        changes by waiting. Give up on this request instead of stalling the queue."""
        self.waiting.remove(req)
        stats = self.cache.stats()
        req.error = PromptTooLong(
            f"request needs more KV blocks than are free with no other request running "
            f"({stats.blocks_free} free, {stats.blocks_pinned} pinned, "
            f"{self.num_blocks} total)",
            param="max_tokens",
        )
        self._finish(req, "abort")
        self._outputs.append(req.make_output())

    def _make_seq(
        self, req: Request, num_new: int, scheduled: dict[str, int], now: float
    ) -> ScheduledSeq:
        assert num_new >= 1, f"{req.request_id}: nothing to compute"
        start = req.num_computed
        end = start + num_new
        assert len(req.block_table) * self.block_size >= end
        scheduled[req.request_id] = end
        # its tokens and what they attend to: a cached prefix is not computed, but it is read
        self.fair.charge(req.tenant, num_new, start, end == req.num_tokens)
        if req.first_scheduled_time is None:
            req.first_scheduled_time = now
        return ScheduledSeq(
            request_id=req.request_id,
            token_ids=req.all_token_ids[start:end],
            start_pos=start,
            block_table=req.block_table,
            sample=end == req.num_tokens,
            sampling=req.sampling,
            num_generated=req.num_output_tokens,
            history=req.all_token_ids,
        )

    # ------------------------------------------------------------------ update

    def update(
        self, batch: ScheduledBatch, sampled: Sequence[Sampled | None]
    ) -> list[RequestOutput]:
        """Record a finished step: commit K/V, append sampled tokens, finish stopped requests.
        A ``TokenLogprob`` entry is a token sampled with logprobs (kept for the request's output);
        a ``FinalToken`` one ends its request after the token (its grammar ended).
        Returns one output per request that got a token or finished (also outside this step)."""
        assert len(sampled) == len(batch.seqs), "one sampled entry per scheduled seq"
        outputs, self._outputs = self._outputs, []
        # Commit every chunk before freeing anything: a request finishing in this step must not
        # hand its freshly computed blocks on as if they were never computed.
        for seq in batch.seqs:
            req = self.requests[seq.request_id]
            assert req.num_computed == seq.start_pos, f"{req.request_id}: moved under a step"
            req.num_computed = seq.end_pos
            self.cache.commit(req.request_id, req.num_computed)
        now = self.clock()
        for seq, token in zip(batch.seqs, sampled, strict=True):
            if not seq.sample:
                continue
            assert token is not None, f"{seq.request_id}: runner returned no token"
            req = self.requests[seq.request_id]
            final, got = (token, token.sampled) if isinstance(token, FinalToken) else (None, token)
            if isinstance(got, TokenLogprob):
                req.logprobs.append(got)
                tid = got.token_id
            else:
                tid = got
            req.all_token_ids.append(tid)
            if req.first_token_time is None:
                req.first_token_time = now
            reason = self._stop_reason(req, tid, final)
            if reason is not None:
                self._finish(req, reason)
            outputs.append(req.make_output())
        return outputs

    def _stop_reason(
        self, req: Request, token: int, final: FinalToken | None
    ) -> FinishReason | None:
        params = req.sampling
        if not params.ignore_eos and token in self.eos_token_ids:
            return "stop"
        if token in params.stop_token_ids:
            return "stop"
        if final is not None:  # the grammar ended: a complete output stops, even at max_tokens
            if final.error is None:
                return "stop"
            req.error = GrammarRejected(f"grammar engine failed mid-output: {final.error}")
            return "abort"
        if req.num_output_tokens >= params.max_tokens or req.num_tokens >= self.max_model_len:
            return "length"
        return None

    # ------------------------------------------------------------------ freeing

    def _finish(self, req: Request, reason: FinishReason) -> None:
        self.fair.depart(req.tenant, was_waiting=req.status is RequestStatus.WAITING)
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
            self._apply_handoffs(self.cache.free(req.request_id), {})
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        req.finish_time = self.clock()
        req.block_table = ()
        del self.requests[req.request_id]

    def _preempt(self, req: Request, scheduled: dict[str, int]) -> None:
        self.running.remove(req)
        self._apply_handoffs(self.cache.free(req.request_id), scheduled)
        req.status = RequestStatus.WAITING
        req.num_computed = 0
        req.block_table = ()
        req.may_have_deps = False
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.fair.requeued(req.tenant)
        req.enqueued_step = self.num_steps
        self.waiting.appendleft(req)

    def _apply_handoffs(self, handoffs: Sequence[Handoff], scheduled: dict[str, int]) -> None:
        """An owner left before computing its PENDING blocks: each inheritor recomputes them."""
        for h in handoffs:
            heir = self.requests[h.request_id]
            assert heir.status is RequestStatus.RUNNING, f"handoff to non-running {heir}"
            assert heir.request_id not in scheduled, "handoff to a request already scheduled"
            heir.num_computed = min(heir.num_computed, h.from_token)
            if heir.num_output_tokens == 0 and heir.num_cached_tokens is not None:
                # usage reports what the model skipped: these tokens are computed after all
                heir.num_cached_tokens = min(heir.num_cached_tokens, h.from_token)
            heir.may_have_deps = True  # it may still read blocks of other owners

    # ------------------------------------------------------------------ integrity

    def check_integrity(self) -> None:
        """Raise AssertionError if queues, request states, block tables or the fair-share
        state are inconsistent (engine/core/sched_integrity.py)."""
        check_scheduler(self)
