"""``FakeEngine``: an ``EngineClient`` (engine/api.py) for tests that need one part of it.

Subclasses override what their test exercises; every other call fails loudly, so a test never
passes because a fake quietly did nothing.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence

from engine.api import DEFAULT_OPTIONS, EngineClient, EngineInfo, GenerateOptions, PinStatus
from engine.api import PinTicket as PinTicket
from engine.core.kv import CacheStats
from engine.outputs import RequestOutput
from engine.params import SamplingParams


class FakeEngine(EngineClient):
    @property
    def info(self) -> EngineInfo:
        raise AssertionError(f"{type(self).__name__}: info is not part of this test")

    @property
    def is_running(self) -> bool:
        return True

    async def generate(
        self,
        token_ids: Sequence[int],
        params: SamplingParams,
        options: GenerateOptions = DEFAULT_OPTIONS,
    ) -> AsyncGenerator[RequestOutput, None]:
        raise AssertionError(f"{type(self).__name__}: generate is not part of this test")
        yield  # an async generator, as the protocol's implementations are

    async def abort(self, request_id: str) -> None:
        raise AssertionError(f"{type(self).__name__}: abort is not part of this test")

    async def pin(self, owner: str, namespace: str, token_ids: Sequence[int]) -> PinTicket:
        raise AssertionError(f"{type(self).__name__}: pin is not part of this test")

    async def unpin(self, ticket: PinTicket) -> None:
        raise AssertionError(f"{type(self).__name__}: unpin is not part of this test")

    def pin_status(self, ticket: PinTicket | None) -> PinStatus:
        raise AssertionError(f"{type(self).__name__}: pin_status is not part of this test")

    async def forget_namespace(self, namespace: str) -> bool:
        raise AssertionError(f"{type(self).__name__}: forget_namespace is not part of this test")

    def cache_stats(self) -> CacheStats:
        raise AssertionError(f"{type(self).__name__}: cache_stats is not part of this test")

    async def start(self) -> None:
        pass

    async def shutdown(self) -> None:
        pass
