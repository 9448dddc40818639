"""The step machine (``EngineCore``) and the synchronous, offline ``Engine``.

``EngineCore`` owns the model runner, the prefix cache and the scheduler; one thread drives it.
``Engine`` drives it from the caller's thread (batch generation, tests, benchmarks);
``AsyncEngine`` (engine/serving/async_engine.py) drives it from a dedicated thread for the gateway.

Pinning a prefix: ``cache.pin`` needs every full block of the prefix READY. When it is not cached
yet, the core runs an internal request over the prefix (one greedy token, then dropped); when that
request finishes, its blocks are READY and unreferenced, and the pin is taken in the same thread
before the next ``schedule()`` can evict anything.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from engine.config import EngineConfig
from engine.constraints import Grammar
from engine.core.batch import Sampled
from engine.core.kv import (
    CacheListener,
    CacheScope,
    CacheStats,
    PinHandle,
    PrefixCache,
    PriorityRange,
)
from engine.core.options import DEFAULT_OPTIONS, GenerateFields, GenerateOptions
from engine.core.request import Request
from engine.core.scheduler import Scheduler
from engine.errors import PinRejected
from engine.outputs import RequestOutput
from engine.params import SamplingParams
from engine.serving.runner_api import Runner

if TYPE_CHECKING:
    from engine.runtime.snapshot_restore import Snapshots  # imports torch: loaded with the runner
    from engine.text.tokenizer import Tokenizer

_PIN_PREFIX = "__pin-"  # internal request ids; user ids never start with it (gateway ids do not)
_PIN_PARAMS = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)


@dataclass(eq=False)
class PinJob:
    namespace: str
    token_ids: tuple[int, ...]
    on_done: Callable[[PinJob], None] | None = None
    request_id: str | None = None  # internal request computing the prefix, if one was needed
    handle: PinHandle | None = None
    error: Exception | None = None
    done: bool = field(default=False)

    def finish(self, handle: PinHandle | None, error: Exception | None) -> None:
        self.handle, self.error, self.done = handle, error, True
        if self.on_done is not None:
            self.on_done(self)


class EngineCore:
    """Runner + prefix cache + scheduler. Not thread-safe: exactly one thread calls into it."""

    def __init__(
        self,
        runner: Runner,
        config: EngineConfig,
        *,
        listener: CacheListener | None = None,
        clock: Callable[[], float] = time.monotonic,
        snapshots: Snapshots | None = None,
    ) -> None:
        self.runner = runner
        self.snapshots = snapshots
        self.config = config
        self.clock = clock
        self.cache = PrefixCache(
            runner.num_blocks,
            config.block_size,
            enable_reuse=config.enable_prefix_reuse,
            pin_cap_fraction=config.pin_cap_fraction,
            listener=listener,
            host_blocks=getattr(runner, "num_host_blocks", 0),
            host_threshold=config.host_offload_priority,
            block_bytes=getattr(runner, "block_bytes", 0),
        )
        self.scheduler = Scheduler(
            config,
            self.cache,
            max_model_len=runner.max_model_len,
            eos_token_ids=runner.eos_token_ids,
            clock=clock,
            cost=runner.step_cost,
        )
        self.vocab_size = int(runner.vocab_size)
        self.num_model_tokens = 0  # tokens that went through the model (all steps)
        self._pin_jobs: dict[str, PinJob] = {}
        self._ids = itertools.count()

    @classmethod
    def from_pretrained(
        cls,
        model_dir: str | Path,
        *,
        listener: CacheListener | None = None,
        clock: Callable[[], float] = time.monotonic,
        **overrides: Any,
    ) -> EngineCore:
        from engine.runtime.runner import ModelRunner  # torch lives behind this import

        config = EngineConfig(**overrides)
        runner = ModelRunner.from_pretrained(str(model_dir), config)
        snapshots = None
        if config.kv_snapshot_dir:
            from engine.runtime.snapshot_restore import Snapshots

            snapshots = Snapshots.for_runner(
                config.kv_snapshot_dir, model_dir, runner, config.kv_snapshot_key
            )
        return cls(runner, config, listener=listener, clock=clock, snapshots=snapshots)

    # ------------------------------------------------------------------ requests

    def new_request_id(self) -> str:
        return f"req-{next(self._ids)}"

    def check_request(
        self,
        token_ids: Sequence[int],
        params: SamplingParams,
        options: GenerateOptions = DEFAULT_OPTIONS,
    ) -> None:
        """Raise PromptTooLong / ValueError / GrammarRejected for a request that can never run:
        the one validation of a request, by whoever accepts it (``AsyncEngine.generate`` on the
        caller's side, ``add_request`` for the rest). An id outside the vocabulary would fail
        inside the forward and stop the engine for every request; a grammar that does not
        compile would fail its first sampling step."""
        if params.grammar is not None:
            self.check_grammar(params.grammar)
        self.check_shape(token_ids, params, options)

    def check_shape(
        self, token_ids: Sequence[int], params: SamplingParams, options: GenerateOptions
    ) -> None:
        """``check_request`` but the grammar (which its caller checked off the event loop)."""
        self.scheduler.check_fits(len(token_ids), params.max_tokens)
        if token_ids and (min(token_ids) < 0 or max(token_ids) >= self.vocab_size):
            raise ValueError(f"token ids must lie in 0..{self.vocab_size - 1}")
        if any(not 0 <= tok < self.vocab_size for tok, _ in params.logit_bias):
            raise ValueError(f"logit_bias token ids must lie in 0..{self.vocab_size - 1}")
        for rng in options.priorities:
            rng.check()

    def check_grammar(self, grammar: Grammar) -> None:
        """GrammarRejected unless ``grammar`` compiles for this model's tokenizer (compiled once
        per digest, cached; any thread)."""
        from engine.constraints.compiler import check_grammar

        check_grammar(grammar, self.runner.tokenizer)

    def add_request(
        self,
        token_ids: Sequence[int],
        params: SamplingParams,
        options: GenerateOptions = DEFAULT_OPTIONS,
        *,
        arrival_time: float | None = None,
    ) -> str:
        """Validate (``check_request``) and queue a request; its id."""
        ids = tuple(int(t) for t in token_ids)
        self.check_request(ids, params, options)
        return self.add_checked(ids, params, options, arrival_time)

    def add_checked(
        self,
        token_ids: tuple[int, ...],
        params: SamplingParams,
        options: GenerateOptions,
        arrival_time: float | None = None,
    ) -> str:
        """Queue a request its caller validated with ``check_request`` (``AsyncEngine``
        validates on the event loop, before it posts the request to this thread); its id."""
        rid = options.request_id if options.request_id is not None else self.new_request_id()
        at = self.clock() if arrival_time is None else arrival_time
        self.scheduler.enqueue(Request(rid, token_ids, params, options, at))
        return rid

    def abort(self, request_id: str) -> RequestOutput | None:
        out = self.scheduler.abort(request_id)
        if out is None:
            return None
        routed = self._route([out])  # an internal pin request finishes its job instead
        return routed[0] if routed else None

    def has_work(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """One schedule -> execute -> update; outputs of user requests that advanced."""
        batch = self.scheduler.schedule()
        self.flush_transfers()  # host-tier copies this batch reads (or frees) come first
        sampled: list[Sampled | None] = []
        if not batch.is_empty:
            sampled = list(self.runner.execute(batch))
            self.num_model_tokens += batch.num_tokens
        return self._route(self.scheduler.update(batch, sampled))

    def flush_transfers(self) -> None:
        """Perform the device <-> host copies the cache planned (engine/core/kv/transfers.py)."""
        self.cache.run_transfers(self.runner.transfer)

    def _route(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """Complete pin jobs whose internal request finished; return the user outputs."""
        user: list[RequestOutput] = []
        for out in outputs:
            job = self._pin_jobs.get(out.request_id)
            if job is None:
                user.append(out)
            elif out.finished:
                del self._pin_jobs[out.request_id]
                self._try_pin(job, final=True, error=out.error)
        return user

    # ------------------------------------------------------------------ pins

    def start_pin(
        self,
        namespace: str,
        token_ids: Sequence[int],
        on_done: Callable[[PinJob], None] | None = None,
    ) -> PinJob:
        """Pin the prefix now if it is cached, else compute it first (job finishes in a step)."""
        job = PinJob(namespace, tuple(int(t) for t in token_ids), on_done)
        if len(job.token_ids) < self.config.block_size:
            job.finish(None, PinRejected("prefix shorter than one KV block", reason="too_short"))
            return job
        if not self._try_pin(job, final=not self.config.enable_prefix_reuse) and not (
            self.snapshots is not None
            and self.snapshots.restore(self.cache, namespace, job.token_ids)
            and self._try_pin(job, final=False)
        ):
            job.request_id = f"{_PIN_PREFIX}{next(self._ids)}"
            self._pin_jobs[job.request_id] = job
            try:
                options = GenerateOptions(namespace, job.request_id)
                self.add_request(job.token_ids, _PIN_PARAMS, options)
            except Exception as exc:
                del self._pin_jobs[job.request_id]
                job.finish(None, PinRejected(f"prefix cannot be computed: {exc}"))
        return job

    def _try_pin(self, job: PinJob, *, final: bool, error: Exception | None = None) -> bool:
        """Try cache.pin; finish the job on success, or on failure when ``final``."""
        result = self.cache.pin(job.namespace, job.token_ids)
        if isinstance(result, PinHandle):
            if self.snapshots is not None:
                self.snapshots.save(self.cache, job.namespace, job.token_ids)
            job.finish(result, None)
            return True
        if final:
            reason = getattr(result, "reason", None)
            detail = f" ({error})" if error is not None else ""
            job.finish(None, PinRejected(f"prefix not pinned: {reason}{detail}", reason=reason))
            return True
        return False

    def unpin(self, handle: PinHandle) -> None:
        self.cache.unpin(handle)

    def forget_namespace(self, namespace: str) -> Future[bool] | None:
        """Remove the namespace's disk snapshot (any thread; None without snapshots)."""
        return self.snapshots.forget(namespace) if self.snapshots is not None else None

    def abort_all(self) -> list[RequestOutput]:
        outs = [self.scheduler.abort(rid) for rid in list(self.scheduler.requests)]
        for job in list(self._pin_jobs.values()):
            job.finish(None, PinRejected("engine stopped before the prefix was computed"))
        self._pin_jobs.clear()
        if self.snapshots is not None:
            self.snapshots.flush()  # graceful shutdown: snapshots being written are finished
        return [o for o in outs if o is not None and not o.request_id.startswith(_PIN_PREFIX)]

    def check_integrity(self) -> None:
        self.scheduler.check_integrity()


class Engine:
    """Synchronous offline engine: ``generate`` runs a batch of prompts to completion."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    @classmethod
    def from_pretrained(
        cls,
        model_dir: str | Path,
        *,
        listener: CacheListener | None = None,
        clock: Callable[[], float] = time.monotonic,
        **overrides: Any,
    ) -> Engine:
        """``overrides`` are EngineConfig fields (block_size, enable_prefix_reuse, ...).
        ``clock`` stamps request timings (benchmarks on shared machines pass a CPU-time clock)."""
        core = EngineCore.from_pretrained(model_dir, listener=listener, clock=clock, **overrides)
        return cls(core)

    @property
    def config(self) -> EngineConfig:
        return self.core.config

    @property
    def tokenizer(self) -> Tokenizer:
        return self.core.runner.tokenizer

    @property
    def max_model_len(self) -> int:
        return int(self.core.runner.max_model_len)

    @property
    def num_model_tokens(self) -> int:
        """Tokens that went through the model so far (prefill chunks + decode tokens)."""
        return self.core.num_model_tokens

    @property
    def scheduler(self) -> Scheduler:
        return self.core.scheduler

    @property
    def cache(self) -> PrefixCache:
        return self.core.cache

    def add_request(
        self,
        token_ids: Sequence[int],
        params: SamplingParams,
        options: GenerateOptions | None = None,
        **fields: Unpack[GenerateFields],
    ) -> str:
        """Queue a request (``options``, or its fields as keywords: ``namespace=...``)."""
        return self.core.add_request(token_ids, params, GenerateOptions.of(options, **fields))

    def step(self) -> list[RequestOutput]:
        return self.core.step()

    def has_unfinished(self) -> bool:
        return self.core.has_work()

    def abort(self, request_id: str) -> RequestOutput | None:
        return self.core.abort(request_id)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        namespace: str = "default",
        priorities: Sequence[PriorityRange] = (),
        cache_scope: CacheScope | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; final outputs in prompt order. Outputs of requests
        added separately with add_request that finish meanwhile are not returned.
        ``cache_scope`` (every prompt): prefix-cache keys past its shared tokens are private."""
        if params is None:
            params = SamplingParams()
        plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(plist)} SamplingParams for {len(prompts)} prompts")
        options = GenerateOptions(namespace, priorities=tuple(priorities), cache_scope=cache_scope)
        batch = [(tuple(int(t) for t in p), sp) for p, sp in zip(prompts, plist, strict=True)]
        for p, sp in batch:  # validate all before adding any
            self.core.check_request(p, sp, options)
        ids = [self.core.add_checked(p, sp, options) for p, sp in batch]
        pending = set(ids)
        finals: dict[str, RequestOutput] = {}
        while pending:
            for out in self.step():
                if out.finished and out.request_id in pending:
                    pending.discard(out.request_id)
                    finals[out.request_id] = out
        return [finals[rid] for rid in ids]

    def pin_prefix(self, namespace: str, token_ids: Sequence[int]) -> PinHandle:
        """Compute ``token_ids`` once (or find them cached) and pin their full blocks."""
        job = self.core.start_pin(namespace, token_ids)
        while not job.done:
            self.step()
        if job.error is not None:
            raise job.error
        assert job.handle is not None
        return job.handle

    def unpin(self, handle: PinHandle) -> None:
        self.core.unpin(handle)

    def cache_stats(self) -> CacheStats:
        return self.core.cache.stats()

    def check_integrity(self) -> None:
        self.core.check_integrity()
