"""``WorkerClient``: one worker, from a gateway: its probes over HTTP, its calls over the transport.

    info, tokenizer     GET /v1/info, /v1/tokenizer (aiohttp; the bearer token)
    everything else     one ``WorkerChannel`` (engine/remote/channel.py): a WebSocket to the
                        worker's port (the local worker's Unix socket for ``kvgate serve``)

Failures are sorted by what the caller may still do::

    WorkerUnavailable   nothing was generated (no connection, no reply, the connection dropped
                        before the first output): the request may go to another worker
    WorkerLost          the connection dropped after outputs were delivered: the request fails
    engine errors       the worker's engine refused (PromptTooLong, EngineOverloaded, ...)
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import TypeVar

import aiohttp

from engine.api import GenerateOptions
from engine.core.kv import PinHandle
from engine.errors import EngineDead
from engine.outputs import RequestMetrics, RequestOutput
from engine.params import SamplingParams
from engine.remote import messages as m
from engine.remote.channel import LOST, WorkerChannel, WorkerUnavailable
from engine.remote.messages import KvEvent, TokenizerPayload, WorkerInfo, WorkerLoad

__all__ = ["WorkerClient", "WorkerInfo", "WorkerLoad", "WorkerLost", "WorkerUnavailable"]
PIN_TIMEOUT_S = 300.0  # a pin may wait for a prefill queued behind requests


class WorkerLost(EngineDead):
    """The worker went away while streaming a request."""


def _unreachable(exc: BaseException) -> WorkerUnavailable:
    refused = isinstance(exc, ConnectionRefusedError | aiohttp.ClientConnectorError)
    return WorkerUnavailable(f"worker unreachable: {type(exc).__name__}", refused=refused)


class WorkerClient:
    def __init__(
        self,
        url: str,
        token: str,
        session: aiohttp.ClientSession,
        timeout_s: float = 2.0,
        unix_path: str | None = None,  # the local worker's Unix socket: calls go there
    ) -> None:
        self.url = url.rstrip("/")
        self._token = token
        self._headers = {"Authorization": f"Bearer {token}"}
        self._session = session
        self._timeout_s = timeout_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._channel = WorkerChannel(
            self.url, token, session, unix_path=unix_path, connect_s=timeout_s
        )
        self._known = False  # /v1/info read and its protocol matched: calls may go out
        self.rewarms = 0  # a worker pins: its prompts never need warming again

    @property
    def calls_endpoint(self) -> str:
        """Where the calls go: ``unix:PATH`` (the local worker's socket), else the URL; the
        probes always go to the URL."""
        return self._channel.endpoint

    # -- probes (HTTP) ----------------------------------------------------------------------
    async def _get(self, path: str) -> bytes:
        try:
            async with self._session.get(
                self.url + path, headers=self._headers, timeout=self._timeout
            ) as resp:
                payload = await resp.read()
                if resp.status != 200:
                    raise WorkerUnavailable(f"worker answered {resp.status} on {path}")
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise _unreachable(exc) from None
        return payload

    async def info(self) -> WorkerInfo:
        """The worker's identity and geometry; a worker of another protocol is refused."""
        info = m.from_json(await self._get("/v1/info"), WorkerInfo)
        if info.protocol != m.PROTOCOL:
            raise WorkerUnavailable(
                f"worker {info.worker_id} speaks protocol {info.protocol}, this gateway"
                f" {m.PROTOCOL}: upgrade both to the same release"
            )
        self._known = True
        return info

    async def tokenizer_payload(self) -> TokenizerPayload:
        return m.from_json(await self._get("/v1/tokenizer"), TokenizerPayload)

    async def _chan(self) -> WorkerChannel:
        if not self._known:
            await self.info()
        return self._channel

    # -- calls (transport) ------------------------------------------------------------------
    async def load(self) -> WorkerLoad:
        reply = await (await self._chan()).request(m.Load, self._timeout_s)
        return _expect(reply, m.Loaded).load

    async def abort(self, request_id: str) -> None:
        chan = await self._chan()
        _expect(await chan.request(lambda c: m.Abort(c, request_id), self._timeout_s), m.Done)

    async def pin(self, namespace: str, token_ids: Sequence[int]) -> PinHandle:
        """May wait for a prefill queued behind requests (``PIN_TIMEOUT_S``); a pin whose
        caller gave up is released by the worker."""
        ids = list(token_ids)
        chan = await self._chan()
        reply = await chan.request(lambda c: m.Pin(c, namespace, ids), PIN_TIMEOUT_S)
        return _expect(reply, m.Pinned).handle

    async def unpin(self, handle: PinHandle) -> None:
        chan = await self._chan()
        _expect(await chan.request(lambda c: m.Unpin(c, handle), self._timeout_s), m.Done)

    async def forget(self, namespace: str) -> bool:
        """Delete the namespace's disk snapshot on the worker; whether it had one."""
        chan = await self._chan()
        reply = await chan.request(lambda c: m.Forget(c, namespace), self._timeout_s)
        return _expect(reply, m.Forgot).removed

    async def events(self) -> AsyncIterator[list[KvEvent]]:
        """KV event batches until the worker ends the subscription or the connection drops."""
        chan = await self._chan()
        async with contextlib.aclosing(chan.stream(m.Subscribe)) as replies:
            async for item in replies:
                if item is LOST:
                    raise WorkerUnavailable("event stream lost")
                if isinstance(item, m.EventsEnd):
                    return
                if not isinstance(item, m.Events):
                    raise m.WireError(f"unexpected {type(item).__name__} in an event stream")
                if item.events:
                    yield item.events

    async def generate(
        self, token_ids: Sequence[int], params: SamplingParams, options: GenerateOptions
    ) -> AsyncGenerator[RequestOutput, None]:
        """Outputs as ``AsyncEngine.generate`` yields them (``interim=False``: the first and the
        final only). Leaving early cancels the call, which aborts the request on the worker.
        ``options.request_id`` must be set."""
        rid = options.request_id
        assert rid is not None, "the cluster names every request"
        chan = await self._chan()
        ids = list(token_ids)
        decoder = _Decoder(rid, len(ids))
        call = chan.stream(lambda c: m.Generate(c, ids, params, options))
        async with contextlib.aclosing(call) as replies:
            async for item in replies:
                if item is LOST:
                    raise decoder.broken("connection lost")
                if isinstance(item, m.Failed):
                    raise item.error.rebuild()
                if not isinstance(item, m.Output):
                    raise m.WireError(f"unexpected {type(item).__name__} in a generate stream")
                out = decoder.output(item)
                yield out
                if out.finished:
                    return

    async def close(self) -> None:
        await self._channel.close()


_R = TypeVar("_R")


def _expect(reply: m.Reply, cls: type[_R]) -> _R:
    if not isinstance(reply, cls):
        raise m.WireError(f"expected {cls.__name__}, got {type(reply).__name__}")
    return reply


class _Decoder:
    """Frames of one generate call -> RequestOutputs (token deltas summed here)."""

    def __init__(self, request_id: str, num_prompt_tokens: int) -> None:
        self._rid = request_id
        self._n_prompt = num_prompt_tokens
        self._tokens: list[int] = []
        self._cached = 0
        self._metrics = RequestMetrics(arrival_time=0.0)
        self._delivered = False

    def broken(self, why: str) -> EngineDead:
        return WorkerLost(why) if self._delivered else WorkerUnavailable(why)

    def output(self, frame: m.Output) -> RequestOutput:
        new = tuple(frame.new_token_ids)
        self._tokens.extend(new)
        if frame.metrics is not None:
            self._metrics = frame.metrics
        if frame.cached is not None:
            self._cached = frame.cached
        if frame.finished and frame.token_ids != self._tokens:
            raise m.WireError("final token ids differ from the sum of the deltas")
        self._delivered = True
        return RequestOutput(
            request_id=self._rid,
            num_prompt_tokens=self._n_prompt,
            token_ids=tuple(self._tokens),
            new_token_ids=new,
            num_cached_tokens=self._cached,
            finished=frame.finished,
            finish_reason=frame.finish_reason,
            metrics=self._metrics,
            error=frame.error.rebuild() if frame.error is not None else None,
            new_logprobs=tuple(frame.logprobs) if frame.logprobs is not None else None,
        )
