"""``VllmClient``: one vLLM server as a replica of the gateway's cluster (a ``ReplicaClient``).

    info / load      GET /v1/models, /metrics, /health (vllm_probe.py)
    generate         POST /v1/completions, token ids, streamed (vllm_wire.py); closing the
                     stream aborts the request on the server
    events           its ZMQ KV-event publisher (kv_subscriber.py; KVGATE_KV_EVENTS, else
                     GET /kv_event_sources), in the gateway's keys (vllm_keys.py)
    pin / unpin      vLLM has no pin: the prompt is prewarmed (a one-token completion under its
                     salt) and warmed again when the events say one of its blocks left, as
                     vllm_rewarm.py allows (recent tenants, an idle server, one at a time)
    forget           nothing to forget (no disk snapshots): False

Failures, as the cluster sorts them (client.py): ``WorkerUnavailable`` when nothing was delivered
(refused, 5xx, a stream cut before its first token), ``WorkerLost`` once outputs were delivered,
``PromptTooLong`` / ``GrammarRejected`` / ``RequestRejected`` for a 400.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field

import aiohttp
import structlog

from engine.api import GenerateOptions, PinHandle, request_id_or_new
from engine.errors import EngineError, EngineOverloaded
from engine.outputs import RequestOutput
from engine.params import SamplingParams
from engine.remote.client import WorkerUnavailable
from engine.remote.keys import reusable_block_keys
from engine.remote.kv_subscriber import KVEventEndpoint, KVEventSubscriber
from engine.remote.messages import PROTOCOL, KvEvent, Removed, WorkerInfo, WorkerLoad
from engine.remote.vllm_keys import VllmKeyMap
from engine.remote.vllm_probe import ServerMetrics, event_sources, parse_metrics, served_model
from engine.remote.vllm_rewarm import RECENT_S, Kept, Rewarmer
from engine.remote.vllm_stream import StreamState, rejection
from engine.remote.vllm_wire import completion_body, vllm_salt

log = structlog.get_logger(__name__)
PIN_BUDGET_FRACTION = 0.5  # of a server's KV blocks, prompts the placement keeps warm there
REWARM_PRIORITY = 1 << 20  # vLLM runs lower values first: a re-warm after every request
_PIN_IDS = itertools.count(1)


@dataclass
class _Flight:
    aborted: asyncio.Event = field(default_factory=asyncio.Event)
    resp: aiohttp.ClientResponse | None = None


@dataclass
class WarmPrompt:
    """A prompt kept warm on this server: its blocks' keys (hex), as its events name them."""

    namespace: str
    token_ids: tuple[int, ...]
    keys: frozenset[str]


class VllmClient:
    def __init__(
        self,
        url: str,
        token: str | None,
        session: aiohttp.ClientSession,
        timeout_s: float = 5.0,
        *,
        kv_events: KVEventEndpoint | None = None,
        priority: bool = False,
        rewarm_recent_s: float = RECENT_S,
    ) -> None:
        """``rewarm_recent_s``: kept prompts are warmed again for tenants with a request here
        this recently (engine/remote/vllm_rewarm.py; 0: never)."""
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._kv_events = kv_events
        self._priority = priority
        self.model = ""
        self.block_size = 0
        self.num_blocks = 0  # the server's KV cache
        self._boot = ""
        self._flights: dict[str, _Flight] = {}  # request id -> its stream
        self.warm: dict[int, WarmPrompt] = {}  # pin id -> prompt
        self.rewarmer = Rewarmer(
            self._rewarm, lambda: self._requests > 0, self._kept, recent_s=rewarm_recent_s
        )
        self._requests = 0  # in flight, re-warms not counted
        self.served = 0

    @property
    def rewarms(self) -> int:
        """Prompts warmed again after the server dropped some of their blocks."""
        return self.rewarmer.done

    @property
    def calls_endpoint(self) -> str:
        return self.url + "/v1/completions"

    # -- probes -----------------------------------------------------------------------------
    async def _get(self, path: str) -> bytes:
        try:
            async with self._session.get(
                self.url + path, headers=self._headers, timeout=self._timeout
            ) as resp:
                payload = await resp.read()
                if resp.status != 200:
                    raise WorkerUnavailable(f"vLLM answered {resp.status} on {path}")
                return payload
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            refused = isinstance(exc, ConnectionRefusedError | aiohttp.ClientConnectorError)
            raise WorkerUnavailable(
                f"vLLM unreachable: {type(exc).__name__}", refused=refused
            ) from None

    async def metrics(self) -> ServerMetrics:
        return parse_metrics((await self._get("/metrics")).decode(errors="replace"))

    async def info(self) -> WorkerInfo:
        """The server's model and geometry; the block size from its ``cache_config_info``."""
        try:
            self.model, max_len = served_model(json.loads(await self._get("/v1/models")))
        except ValueError as exc:
            raise WorkerUnavailable(str(exc)) from None
        metrics = await self.metrics()
        self.block_size = metrics.block_size
        self.num_blocks = metrics.num_blocks
        self._boot = _boot_id(metrics)
        budget = int(metrics.num_blocks * PIN_BUDGET_FRACTION)
        return WorkerInfo(
            self.url, self._boot, metrics.block_size, max_len, metrics.num_blocks, budget, PROTOCOL
        )

    async def load(self) -> WorkerLoad:
        await self._get("/health")
        metrics = await self.metrics()
        stats = metrics.cache_stats()
        return WorkerLoad(
            True, _boot_id(metrics), metrics.running, metrics.waiting, 0, self.served, stats
        )

    # -- requests ---------------------------------------------------------------------------
    async def generate(
        self, token_ids: Sequence[int], params: SamplingParams, options: GenerateOptions
    ) -> AsyncGenerator[RequestOutput, None]:
        """Outputs as the server streams tokens; the last carries ``cached_tokens``."""
        self.rewarmer.used(options.namespace)
        self._requests += 1
        try:
            async for out in self._stream(token_ids, params, options, None):
                yield out
        finally:
            self._requests -= 1
            self.rewarmer.kick()

    async def _stream(
        self,
        token_ids: Sequence[int],
        params: SamplingParams,
        options: GenerateOptions,
        priority: int | None,
    ) -> AsyncGenerator[RequestOutput, None]:
        rid = request_id_or_new(options.request_id)
        if not self.model:
            await self.info()
        ids = list(token_ids)
        body = completion_body(self.model, ids, params, options, priority=self._priority)
        if priority is not None and self._priority:
            body["priority"] = priority
        state = StreamState(rid, len(ids), params.logprobs)
        flight = _Flight()
        self._flights[rid] = flight
        try:
            async with self._post(body) as resp:
                flight.resp = resp
                if flight.aborted.is_set():
                    resp.close()
                async for out in state.read(resp, flight.aborted):
                    yield out
            self.served += 1
        finally:
            if self._flights.get(rid) is flight:
                del self._flights[rid]

    @contextlib.asynccontextmanager
    async def _post(self, body: dict[str, object]) -> AsyncIterator[aiohttp.ClientResponse]:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._timeout.total)
        url = self.url + "/v1/completions"
        try:
            resp = await self._session.post(url, json=body, headers=self._headers, timeout=timeout)
        except aiohttp.ClientConnectorError as exc:
            raise WorkerUnavailable(f"vLLM unreachable: {exc}", refused=True) from None
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise WorkerUnavailable(f"vLLM unreachable: {type(exc).__name__}") from None
        try:
            if resp.status != 200:
                raise await _refusal(resp, "structured_outputs" in body)
            yield resp
        finally:
            resp.release()

    async def abort(self, request_id: str) -> None:
        """The request's stream ends with a final "abort" output: its connection is closed,
        which stops the request on the server."""
        flight = self._flights.get(request_id)
        if flight is not None:
            flight.aborted.set()
            if flight.resp is not None:
                flight.resp.close()

    # -- KV events --------------------------------------------------------------------------
    async def _event_endpoint(self) -> KVEventEndpoint | None:
        if self._kv_events is not None:
            return self._kv_events
        try:
            found = event_sources(json.loads(await self._get("/kv_event_sources")), self.url)
        except (WorkerUnavailable, ValueError):
            return None
        return None if found is None else KVEventEndpoint(self.url, found[0], found[1])

    async def events(self) -> AsyncIterator[list[KvEvent]]:
        """KV event batches in the gateway's keys; nothing when the server publishes none
        (routing then follows the placement alone)."""
        endpoint = await self._event_endpoint()
        if endpoint is None:
            return
        if not self.block_size:
            await self.info()
        keys = VllmKeyMap(self.block_size)
        async with KVEventSubscriber(endpoint) as sub:
            async for batch in sub.batches():
                events = keys.translate(batch.events)
                self.rewarm_after(events)
                if events:
                    yield events

    # -- pins: prewarm and keep warm --------------------------------------------------------
    async def pin(self, namespace: str, token_ids: Sequence[int]) -> PinHandle:
        if not self.block_size:
            await self.info()
        ids = tuple(token_ids)
        await self._warm(namespace, ids, None)
        salt = vllm_salt(namespace, None)
        keys = frozenset(k.hex() for k in reusable_block_keys(salt, ids, self.block_size))
        pin_id = next(_PIN_IDS)
        self.warm[pin_id] = WarmPrompt(namespace, ids, keys)
        return PinHandle(pin_id, namespace, (), len(keys) * self.block_size)

    async def unpin(self, handle: PinHandle) -> None:
        self.warm.pop(handle.pin_id, None)  # a re-warm due for it is dropped

    async def forget(self, namespace: str) -> bool:
        return False  # vLLM keeps no disk snapshots

    async def _warm(self, namespace: str, ids: tuple[int, ...], priority: int | None) -> None:
        params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        options = GenerateOptions(namespace, request_id_or_new(None))
        async for _ in self._stream(ids, params, options, priority):
            pass

    def rewarm_after(self, events: list[KvEvent]) -> None:
        """Kept prompts that lost a block are due to be warmed again (vllm_rewarm.py)."""
        gone = {e.key for e in events if isinstance(e, Removed)}
        if gone:
            self.rewarmer.mark(p for p, w in self.warm.items() if w.keys & gone)
            self.rewarmer.kick()

    def _kept(self) -> tuple[dict[int, Kept], int]:
        kept = {p: Kept(w.namespace, len(w.keys)) for p, w in self.warm.items()}
        return kept, self.num_blocks

    async def _rewarm(self, pin_id: int) -> None:
        prompt = self.warm.get(pin_id)
        if prompt is not None:
            await self._warm(prompt.namespace, prompt.token_ids, REWARM_PRIORITY)

    async def close(self) -> None:
        await self.rewarmer.close()


def _boot_id(metrics: ServerMetrics) -> str:
    """Changes when the server restarted (its process start time), so the cluster re-reads it
    and warms its prompts again."""
    return f"vllm-{metrics.start_time or 0:.3f}"


async def _refusal(resp: aiohttp.ClientResponse, structured: bool) -> EngineError:
    """The error a non-200 answer stands for."""
    text = await resp.text(errors="replace")
    if resp.status == 400:
        return rejection(text, structured)
    if resp.status in (429, 503):
        return EngineOverloaded(f"vLLM answered {resp.status}")
    log.warning("vllm_refused", status=resp.status, body=text[:200])
    return WorkerUnavailable(f"vLLM answered {resp.status}")
