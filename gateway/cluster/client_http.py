"""``HttpWorkerClient``: the worker calls over HTTP/1.1 (the protocol before the message
transport; kept only to measure the two side by side, ``kvgate bench gateway``).

Failures are sorted by what the caller may still do::

    WorkerUnavailable   nothing was generated (no connection, no response head, bad status):
                        the request may go to another worker
    WorkerLost          the stream broke after outputs were delivered: the request fails
    engine errors       the worker's engine refused (PromptTooLong, EngineOverloaded, ...)
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import msgspec

from engine.api import GenerateOptions
from engine.errors import EngineDead
from engine.kv import PinHandle
from engine.outputs import RequestMetrics, RequestOutput
from engine.params import SamplingParams
from engine.worker import wire
from engine.worker.messages import KvEvent, WorkerInfo, WorkerLoad
from gateway.cluster.channel import WorkerUnavailable
from gateway.cluster.client import WorkerLost
from gateway.cluster.stream import ConnectionPool, HttpError, Response

PIN_TIMEOUT_S = 300.0
PIN_TIMEOUT = aiohttp.ClientTimeout(total=PIN_TIMEOUT_S, sock_connect=5.0)


def _unreachable(exc: BaseException) -> WorkerUnavailable:
    refused = isinstance(exc, ConnectionRefusedError | aiohttp.ClientConnectorError) or (
        isinstance(exc, HttpError) and exc.refused
    )
    return WorkerUnavailable(f"worker unreachable: {type(exc).__name__}", refused=refused)


class HttpWorkerClient:
    def __init__(
        self,
        url: str,
        token: str,
        session: aiohttp.ClientSession,
        timeout_s: float = 2.0,
        unix_path: str | None = None,  # generate streams go there (the local worker)
    ) -> None:
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"}
        self._session = session
        self._pool = ConnectionPool(self.url, unix_path=unix_path)
        self._json_headers = {**self._headers, "Content-Type": "application/json"}
        self._connect_s = timeout_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        # generate: connect bounded, the stream itself unbounded (long generations)
        self._stream_timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s)

    async def _get(self, path: str) -> Any:
        return await self._call("GET", path, None)

    async def _call(
        self, method: str, path: str, body: Any, timeout: aiohttp.ClientTimeout | None = None
    ) -> Any:
        data = None if body is None else wire.encode(body)
        try:
            async with self._session.request(
                method,
                self.url + path,
                data=data,
                headers=self._headers,
                timeout=timeout or self._timeout,
            ) as resp:
                payload = await resp.read()
                if resp.status != 200:
                    raise WorkerUnavailable(f"worker answered {resp.status} on {path}")
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise _unreachable(exc) from None
        out = wire.decode(payload)
        if isinstance(out, dict) and "e" in out:
            raise wire.error_from_wire(out["e"])
        return out

    async def info(self) -> WorkerInfo:
        return msgspec.convert(await self._get("/v1/info"), WorkerInfo)

    async def load(self) -> WorkerLoad:
        return msgspec.convert(await self._get("/v1/load"), WorkerLoad)

    async def abort(self, request_id: str) -> None:
        await self._call("POST", "/v1/abort", {"rid": request_id})

    async def pin(self, namespace: str, token_ids: Sequence[int]) -> PinHandle:
        """May wait for a prefill queued behind requests: a long timeout (``PIN_TIMEOUT_S``);
        a pin whose caller gave up is released by the worker."""
        body = {"ns": namespace, "ids": list(token_ids)}
        d = await self._call("POST", "/v1/pin", body, timeout=PIN_TIMEOUT)
        return wire.pin_from_wire(d["handle"])

    async def unpin(self, handle: PinHandle) -> None:
        await self._call("POST", "/v1/unpin", {"handle": wire.pin_to_wire(handle)})

    async def forget(self, namespace: str) -> bool:
        """Delete the namespace's disk snapshot on the worker; whether it had one."""
        return bool((await self._call("POST", "/v1/forget", {"ns": namespace}))["removed"])

    async def events(self) -> AsyncIterator[list[KvEvent]]:
        """KV event batches until the worker ends the stream or the connection breaks."""
        try:
            resp = await self._session.get(
                self.url + "/v1/events", headers=self._headers, timeout=self._stream_timeout
            )
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise _unreachable(exc) from None
        async with resp:
            if resp.status != 200:
                raise WorkerUnavailable(f"worker answered {resp.status} on /v1/events")
            try:
                async for line in resp.content:
                    batch = msgspec.json.decode(line, type=list[KvEvent])
                    if batch:
                        yield batch
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                raise WorkerUnavailable(f"event stream lost: {type(exc).__name__}") from None

    async def generate(
        self, token_ids: Sequence[int], params: SamplingParams, options: GenerateOptions
    ) -> AsyncIterator[RequestOutput]:
        """Outputs as ``AsyncEngine.generate`` yields them (``interim=False``: the first and the
        final only). Closing the iterator early closes the connection, which aborts the request on
        the worker. ``options.request_id`` must be set."""
        request_id = options.request_id
        assert request_id is not None, "the cluster names every request"
        body: dict[str, Any] = {
            "ids": list(token_ids),
            "params": wire.params_to_wire(params),
            "ns": options.namespace,
            "rid": request_id,
        }
        if options.priorities:
            body["prio"] = wire.priorities_to_wire(options.priorities)
        if not options.interim:
            body["interim"] = False
        if options.cache_scope is not None:
            body["scope"] = wire.scope_to_wire(options.cache_scope)
        try:
            resp = await self._pool.request(
                "POST", "/v1/generate", self._json_headers, wire.encode(body), self._connect_s
            )
        except HttpError as exc:
            raise _unreachable(exc) from None
        try:
            async for out in _Decoder(request_id, len(token_ids)).outputs(resp):
                yield out
        finally:
            resp.release()

    async def close(self) -> None:
        self._pool.close()


class _Decoder:
    """Frames of one generate response -> RequestOutputs (token deltas summed here)."""

    def __init__(self, request_id: str, num_prompt_tokens: int) -> None:
        self._rid = request_id
        self._n_prompt = num_prompt_tokens
        self._tokens: list[int] = []
        self._cached = 0
        self._metrics = RequestMetrics(arrival_time=0.0)
        self._delivered = False

    async def outputs(self, resp: Response) -> AsyncIterator[RequestOutput]:
        parts = aiter(resp.parts())
        if resp.status != 200 or resp.headers.get("transfer-encoding") != "chunked":
            # one JSON answer: refused by the engine (200) or a bad request (400)
            payload = await self._read(anext(parts, b""))
            d = wire.decode(payload) if payload else {}
            if isinstance(d, dict) and "e" in d and resp.status in (200, 400):
                raise wire.error_from_wire(d["e"])
            raise WorkerUnavailable(f"worker answered {resp.status} on /v1/generate")
        buffer = b""
        while True:
            while b"\n" not in buffer:
                part = await self._read(anext(parts, b""))
                if not part:
                    raise self._broken("the stream ended before the final output")
                buffer += part
            line, _, buffer = buffer.partition(b"\n")
            d = wire.decode(line)
            if "e" in d:
                await self._drain(parts)
                raise wire.error_from_wire(d["e"])
            out = self._output(d)
            if out.finished:
                await self._drain(parts)  # the chunked end: the connection can be reused
            self._delivered = True
            yield out
            if out.finished:
                return

    async def _drain(self, parts: AsyncIterator[bytes]) -> None:
        with contextlib.suppress(HttpError):
            async for _ in parts:
                pass

    async def _read(self, op: Any) -> bytes:
        try:
            return bytes(await op)
        except HttpError as exc:
            raise self._broken(f"connection lost: {exc}") from None

    def _broken(self, why: str) -> EngineDead:
        return WorkerLost(why) if self._delivered else WorkerUnavailable(why)

    def _output(self, d: dict[str, Any]) -> RequestOutput:
        new = tuple(d["n"])
        self._tokens.extend(new)
        if "m" in d:
            self._metrics = wire.metrics_from_wire(d["m"])
            self._cached = int(d["c"])
        finished = bool(d.get("f"))
        if finished and list(d["t"]) != self._tokens:
            raise wire.WireError("final token ids differ from the sum of the deltas")
        err = d.get("err")
        return RequestOutput(
            request_id=self._rid,
            num_prompt_tokens=self._n_prompt,
            token_ids=tuple(self._tokens),
            new_token_ids=new,
            num_cached_tokens=self._cached,
            finished=finished,
            finish_reason=d.get("r"),
            metrics=self._metrics,
            error=wire.error_from_wire(err) if err is not None else None,
            new_logprobs=wire.logprobs_from_wire(d.get("lp")),
        )
