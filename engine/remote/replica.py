"""``ReplicaClient``: what the gateway's cluster (gateway/cluster/engine.py) calls on one engine
replica, whichever kind it is: a kvgate worker (``client.WorkerClient``) or a vLLM server
(``vllm_client.VllmClient``). The type checker holds both to it.

    info() / load()          identity and geometry; health and load (polled)
    generate(...)            outputs as ``EngineClient.generate`` yields them; nothing delivered
                             -> WorkerUnavailable (the cluster tries another replica)
    events()                 KV event batches in the gateway's block keys, until the stream ends
    pin / unpin              hold a tenant prompt's blocks (a worker pins; vLLM prewarms)
    forget(namespace)        the namespace's disk snapshots removed (vLLM has none: False)
    abort(request_id), close()
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Protocol

from engine.api import GenerateOptions, PinHandle
from engine.outputs import RequestOutput
from engine.params import SamplingParams
from engine.remote.messages import KvEvent, WorkerInfo, WorkerLoad


class ReplicaClient(Protocol):
    url: str

    @property
    def rewarms(self) -> int:
        """Prompts warmed again after their blocks were evicted (a worker pins: 0)."""
        ...

    @property
    def calls_endpoint(self) -> str:
        """Where its requests go (reports)."""
        ...

    async def info(self) -> WorkerInfo: ...

    async def load(self) -> WorkerLoad: ...

    def generate(
        self, token_ids: Sequence[int], params: SamplingParams, options: GenerateOptions
    ) -> AsyncGenerator[RequestOutput, None]: ...

    def events(self) -> AsyncIterator[list[KvEvent]]: ...

    async def pin(self, namespace: str, token_ids: Sequence[int]) -> PinHandle: ...

    async def unpin(self, handle: PinHandle) -> None: ...

    async def forget(self, namespace: str) -> bool: ...

    async def abort(self, request_id: str) -> None: ...

    async def close(self) -> None: ...
