"""``AsyncEngine``: streaming generation for asyncio servers.

The step loop runs on a dedicated thread that owns the ``EngineCore``; the event loop never waits
on model math. Threads meet in exactly two places::

    event loop --commands (SimpleQueue: add, abort, pin, unpin, stop)--> engine thread
    engine thread --loop.call_soon_threadsafe(_dispatch, [(queue, output | error)])--> event loop

Per-request ``asyncio.Queue``s are only used on the event loop; the engine thread holds each
in-flight request's queue (sent with its add command) to address outputs by queue, not by id: a
request id reused right after its stream was left must not receive the old request's outputs.
Abort happens between steps, when the thread applies the command. The waiting queue is bounded
(``max_waiting``): beyond it ``generate`` raises ``EngineOverloaded`` instead of buffering.

A caller that needs no interim outputs (a non-streaming answer: ``interim=False``) is posted only
its first and its final output; the thread folds the steps between into the final one, so the
event loop is not woken for them while the next step computes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import queue
import threading
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from engine.api import (
    NO_PIN,
    EngineInfo,
    GenerateFields,
    GenerateOptions,
    LocalPin,
    PinStatus,
    PinTicket,
)
from engine.config import EngineConfig
from engine.core.fairness import FairShare
from engine.core.kv import CacheListener, CacheStats, PinHandle
from engine.core.request import request_id_or_new
from engine.errors import (
    DuplicateRequestId,
    EngineClosed,
    EngineDead,
    EngineOverloaded,
    RequestAborted,
    TenantQueueFull,
)
from engine.outputs import RequestOutput, TokenLogprob
from engine.params import SamplingParams
from engine.serving.engine import EngineCore, PinJob

if TYPE_CHECKING:
    from engine.text.tokenizer import Tokenizer


@dataclass(frozen=True)
class _Add:
    token_ids: tuple[int, ...]
    params: SamplingParams
    options: GenerateOptions  # checked on the loop, its request id set
    arrival_time: float
    sink: asyncio.Queue[RequestOutput | BaseException]  # put into on the event loop only

    @property
    def request_id(self) -> str:
        assert self.options.request_id is not None, "an added request is named"
        return self.options.request_id


@dataclass(frozen=True)
class _Abort:
    request_id: str


@dataclass(frozen=True)
class _Pin:
    namespace: str
    token_ids: tuple[int, ...]
    future: concurrent.futures.Future[PinHandle]


@dataclass(frozen=True)
class _Unpin:
    handle: PinHandle
    future: concurrent.futures.Future[None]


_STOP = object()
_Sink = asyncio.Queue[RequestOutput | BaseException]
_Item = tuple[_Sink, RequestOutput | BaseException]


class _FirstAndFinal:
    """``interim=False``: passes the first output, then only the final one, which carries
    every token (and logprob entry) since the first as its delta."""

    def __init__(self) -> None:
        self._sent: int | None = None  # tokens delivered with the first output
        self._logprobs: list[TokenLogprob] = []

    def take(self, out: RequestOutput) -> RequestOutput | None:
        if self._sent is None:
            self._sent = len(out.token_ids)
            return out
        if not out.finished:
            self._logprobs.extend(out.new_logprobs or ())
            return None
        logprobs = out.new_logprobs
        if self._logprobs:
            logprobs = (*self._logprobs, *(logprobs or ()))
        new = out.token_ids[self._sent :]
        return dataclasses.replace(out, new_token_ids=new, new_logprobs=logprobs)


class AsyncEngine:
    """The engine in this process: an ``EngineClient`` (engine/api.py)."""

    def __init__(self, core: EngineCore) -> None:
        self._core = core
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._streams: dict[str, _Sink] = {}  # event loop side: open streams by request id
        self._sinks: dict[str, _Sink] = {}  # engine thread side: queue of each request in flight
        self._folds: dict[str, _FirstAndFinal] = {}  # engine thread side: interim=False requests
        self._adds_in_flight = 0  # submitted, not yet applied by the thread (under _lock)
        self._tenant_adds: dict[str, int] = {}  # the same per tenant (under _lock)
        self._tenant_weights: dict[str, float] = {}  # tenants seen waiting lately (under _lock)
        self._lock = threading.Lock()
        self._stats: CacheStats = core.cache.stats()
        self._closed = False
        self._fatal: BaseException | None = None
        self._waiters: set[concurrent.futures.Future[Any]] = set()  # loop side: pin / unpin sent
        self._stopped: asyncio.Future[None] | None = None  # set by the thread as it exits

    @classmethod
    def from_pretrained(
        cls, model_dir: str | Path, *, listener: CacheListener | None = None, **overrides: Any
    ) -> AsyncEngine:
        """``overrides`` are EngineConfig fields (block_size, max_waiting, ...)."""
        return cls(EngineCore.from_pretrained(model_dir, listener=listener, **overrides))

    # ------------------------------------------------------------------ properties

    @property
    def info(self) -> EngineInfo:
        return EngineInfo(self.tokenizer, self.max_model_len, int(self._core.config.block_size))

    @property
    def tokenizer(self) -> Tokenizer:
        return self._core.runner.tokenizer

    @property
    def max_model_len(self) -> int:
        return int(self._core.runner.max_model_len)

    @property
    def config(self) -> EngineConfig:
        return self._core.config

    @property
    def num_model_tokens(self) -> int:
        return self._core.num_model_tokens

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def cache_stats(self) -> CacheStats:
        """Snapshot taken by the engine thread after its latest step (never blocks)."""
        return self._stats

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._closed:
            raise EngineClosed("the engine was shut down")
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._stopped = self._loop.create_future()
        self._thread = threading.Thread(target=self._run, name="kvgate-engine", daemon=True)
        self._thread.start()

    async def shutdown(self) -> None:
        """Abort everything in flight, stop the thread and wait for it."""
        if self._closed:
            return
        self._closed = True
        thread = self._thread
        if thread is not None:
            self._inbox.put(_STOP)
            assert self._stopped is not None
            await self._stopped  # no executor thread just to wait for ours
            thread.join()
        for q in self._streams.values():
            q.put_nowait(RequestAborted("the engine shut down before the request finished"))

    async def __aenter__(self) -> AsyncEngine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    # ------------------------------------------------------------------ requests

    async def generate(
        self,
        token_ids: Sequence[int],
        params: SamplingParams,
        options: GenerateOptions | None = None,
        **fields: Unpack[GenerateFields],
    ) -> AsyncGenerator[RequestOutput, None]:
        """``EngineClient.generate`` (engine/api.py). ``fields``: options as keywords
        (``namespace=...``, ``request_id=...``), applied over ``options``.

        Raises PromptTooLong, EngineOverloaded, DuplicateRequestId, GrammarRejected, ValueError
        (token id outside the vocabulary, bad priority range) before anything is queued.
        Leaving the loop early (break, cancellation) aborts the request and frees its blocks.
        """
        opts = GenerateOptions.of(options, **fields)
        await self._ensure_running()
        rid = request_id_or_new(opts.request_id)
        opts = dataclasses.replace(opts, request_id=rid)
        if rid in self._streams:
            raise DuplicateRequestId(f"request id {rid!r} is already in flight")
        # The request's one validation (the engine thread takes it as checked): the grammar
        # off the loop (a cold compile takes milliseconds), the rest here.
        if params.grammar is not None:
            await asyncio.to_thread(self._core.check_grammar, params.grammar)
            if rid in self._streams:
                raise DuplicateRequestId(f"request id {rid!r} is already in flight")
        ids = tuple(int(t) for t in token_ids)
        self._core.check_shape(ids, params, opts)
        self._reserve_waiting_slot(opts.tenant, opts.weight)
        q: _Sink = asyncio.Queue()
        self._streams[rid] = q
        self._inbox.put(_Add(ids, params, opts, time.monotonic(), q))
        done = False
        try:
            while True:
                item = await q.get()
                if isinstance(item, BaseException):
                    done = True
                    raise item
                if item.finished:
                    done = True
                    if item.error is not None:
                        raise item.error
                yield item
                if done:
                    return
        finally:
            self._streams.pop(rid, None)
            if not done and not self._closed:
                self._inbox.put(_Abort(rid))

    async def abort(self, request_id: str) -> None:
        """Abort a request in flight (no-op if unknown); its stream ends with finish "abort"."""
        if self.is_running:
            self._inbox.put(_Abort(request_id))

    async def pin(self, owner: str, namespace: str, token_ids: Sequence[int]) -> LocalPin:
        """``EngineClient.pin``: the prefix cache's handle, as a ticket of ``owner``."""
        return LocalPin(owner, await self.pin_prefix(namespace, token_ids))

    async def pin_prefix(self, namespace: str, token_ids: Sequence[int]) -> PinHandle:
        """Compute the prefix once (or find it cached) and pin its blocks; PinRejected if not."""
        fut: concurrent.futures.Future[PinHandle] = concurrent.futures.Future()
        handle: PinHandle = await self._call(_Pin(namespace, tuple(token_ids), fut))
        return handle

    async def unpin(self, ticket: PinTicket | PinHandle) -> None:
        """Release a pin: a ticket of ``pin`` or a handle of ``pin_prefix``."""
        handle = _handle_of(ticket)
        fut: concurrent.futures.Future[None] = concurrent.futures.Future()
        await self._call(_Unpin(handle, fut))

    def pin_status(self, ticket: PinTicket | None) -> PinStatus:
        if ticket is None:
            return NO_PIN
        if not isinstance(ticket, LocalPin):
            raise TypeError(f"not a ticket of this engine: {type(ticket).__name__}")
        return ticket.status()

    async def forget_namespace(self, namespace: str) -> bool:
        """Remove the namespace's disk snapshot (its tenant is gone); whether there was one."""
        removing = self._core.forget_namespace(namespace)
        return False if removing is None else await asyncio.wrap_future(removing)

    async def _call(self, cmd: _Pin | _Unpin) -> Any:
        """Send a command whose future the engine thread resolves, and wait for it. Also tracked
        here: a loop that dies after our liveness check but before reading the command would
        leave it waiting forever; ``_fail_all`` (posted by the dying thread) fails it instead."""
        await self._ensure_running()
        self._waiters.add(cmd.future)
        try:
            self._inbox.put(cmd)
            return await asyncio.wrap_future(cmd.future)
        finally:
            self._waiters.discard(cmd.future)

    async def _ensure_running(self) -> None:
        if self._fatal is not None:
            raise EngineDead(f"engine loop stopped: {self._fatal!r}")
        if self._closed:
            raise EngineClosed("the engine was shut down")
        if self._thread is None:
            await self.start()

    def _reserve_waiting_slot(self, tenant: str, weight: float) -> None:
        """Admit a request into the bounded waiting queue, or refuse it.

        Below ``max_waiting`` anyone may queue (borrowing what idle tenants leave). At the
        limit a tenant is still accepted while it holds less than its share, ``max_waiting *
        weight / (sum of the weights of the tenants waiting)``: a flood fills its own share
        and then only the flooding tenant is refused (TenantQueueFull), never another one. So
        the queue holds at most 2 * max_waiting requests. FCFS: one global bound, as before.
        """
        limit = self._core.config.max_waiting
        fair = self._core.scheduler.fair
        with self._lock:
            # Counts are read without the engine's cooperation: ints, at worst one step old.
            total = self._core.scheduler.num_waiting + self._adds_in_flight
            if total >= limit:
                if not self._core.scheduler.is_fair:
                    raise EngineOverloaded(f"engine queue is full ({limit} requests waiting)")
                mine = fair.waiting_of(tenant) + self._tenant_adds.get(tenant, 0)
                share = limit * weight / (weight + self._others_weight(tenant, fair))
                if mine >= share:
                    raise TenantQueueFull(
                        f"engine queue is full and this tenant holds its share of it "
                        f"({mine} of {limit} requests waiting)"
                    )
            self._adds_in_flight += 1
            self._tenant_adds[tenant] = self._tenant_adds.get(tenant, 0) + 1
            self._tenant_weights[tenant] = weight

    def _others_weight(self, tenant: str, fair: FairShare) -> float:
        """Sum of the weights of the other tenants with requests waiting (under _lock); drops
        the tenants that have none."""
        total = 0.0
        for name in list(self._tenant_weights):
            if fair.waiting_of(name) + self._tenant_adds.get(name, 0) == 0:
                del self._tenant_weights[name]
            elif name != tenant:
                total += self._tenant_weights[name]
        return total

    # ------------------------------------------------------------------ engine thread

    def _run(self) -> None:
        try:
            while True:
                commands = self._drain(block=not self._core.has_work())
                items: list[_Item] = []
                for cmd in commands:
                    if cmd is _STOP:
                        self._core.abort_all()
                        self._stats = self._core.cache.stats()  # what the aborts freed
                        self._refuse_pending(EngineClosed("the engine was shut down"))
                        return
                    items.extend(self._apply(cmd))
                if self._core.has_work():
                    items.extend(self._addressed(self._core.step()))
                self._stats = self._core.cache.stats()
                if items:
                    self._post(items)
        except BaseException as exc:  # the loop must never die silently
            self._fatal = exc
            self._post_fatal(exc)
        finally:
            loop = self._loop
            assert loop is not None
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_set_done, self._stopped)

    def _drain(self, *, block: bool) -> list[Any]:
        commands = [self._inbox.get()] if block else []
        while True:
            try:
                commands.append(self._inbox.get_nowait())
            except queue.Empty:
                return commands

    def _apply(self, cmd: Any) -> list[_Item]:
        core = self._core
        if isinstance(cmd, _Add):
            with self._lock:
                self._adds_in_flight -= 1
                left = self._tenant_adds[cmd.options.tenant] - 1
                if left:
                    self._tenant_adds[cmd.options.tenant] = left
                else:
                    del self._tenant_adds[cmd.options.tenant]
            try:
                core.add_checked(cmd.token_ids, cmd.params, cmd.options, cmd.arrival_time)
            except Exception as exc:  # validated on the loop already; report, do not die
                return [(cmd.sink, exc)]
            self._sinks[cmd.request_id] = cmd.sink
            if not cmd.options.interim:
                self._folds[cmd.request_id] = _FirstAndFinal()
        elif isinstance(cmd, _Abort):
            out = core.abort(cmd.request_id)
            return self._addressed([out]) if out is not None else []
        elif isinstance(cmd, _Pin):
            core.start_pin(cmd.namespace, cmd.token_ids, on_done=self._pin_resolver(cmd.future))
        elif isinstance(cmd, _Unpin):
            try:
                core.unpin(cmd.handle)
                self._stats = core.cache.stats()  # the caller sees its unpin in cache_stats()
                cmd.future.set_result(None)
            except Exception as exc:
                cmd.future.set_exception(exc)
        return []

    def _addressed(self, outputs: list[RequestOutput]) -> list[_Item]:
        """Outputs paired with their request's queue; a finished request's queue is let go."""
        sinks, folds = self._sinks, self._folds
        items: list[_Item] = []
        for out in outputs:
            rid = out.request_id
            sink = sinks.pop(rid, None) if out.finished else sinks.get(rid)
            if sink is None:
                continue
            fold = folds.pop(rid, None) if out.finished else folds.get(rid)
            taken = out if fold is None else fold.take(out)
            if taken is not None:
                items.append((sink, taken))
        return items

    def _pin_resolver(self, fut: concurrent.futures.Future[PinHandle]) -> Any:
        def done(job: PinJob) -> None:
            self._stats = self._core.cache.stats()  # the caller sees its pin in cache_stats()
            if job.error is not None:
                fut.set_exception(job.error)
            else:
                assert job.handle is not None, "a pin job ends with a handle or an error"
                fut.set_result(job.handle)

        return done

    def _refuse_pending(self, err: Exception) -> None:
        """The loop is ending: fail the futures of commands nobody will apply."""
        for cmd in self._drain(block=False):
            if isinstance(cmd, _Pin | _Unpin) and not cmd.future.done():
                cmd.future.set_exception(err)

    def _post(self, items: list[_Item]) -> None:
        loop = self._loop
        assert loop is not None
        # RuntimeError: the event loop closed under us; nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._dispatch, items)

    def _post_fatal(self, exc: BaseException) -> None:
        err = EngineDead(f"engine loop stopped: {exc!r}")
        with contextlib.suppress(Exception):  # best effort: the core may be what broke
            self._core.abort_all()
        self._refuse_pending(err)
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._fail_all, err)

    # ------------------------------------------------------------------ event loop side

    def _dispatch(self, items: list[_Item]) -> None:
        for q, item in items:
            q.put_nowait(item)  # a queue whose stream was left is simply dropped with it

    def _fail_all(self, err: BaseException) -> None:
        for q in self._streams.values():
            q.put_nowait(err)
        for fut in self._waiters:  # the thread is past touching futures when this runs
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                fut.set_exception(err)


def _handle_of(ticket: PinTicket | PinHandle) -> PinHandle:
    if isinstance(ticket, PinHandle):
        return ticket
    if isinstance(ticket, LocalPin):
        return ticket.handle
    raise TypeError(f"not a ticket of this engine: {type(ticket).__name__}")


def _set_done(fut: asyncio.Future[None] | None) -> None:
    if fut is not None and not fut.done():
        fut.set_result(None)
