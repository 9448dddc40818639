"""The gateway's view of one worker: identity, health, load, and routing counters."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from engine.remote.messages import WorkerInfo, WorkerLoad
from engine.remote.replica import ReplicaClient

# Consecutive failed health checks before a worker is taken out: a refused connection (nothing
# listens: the process is gone) counts double, a timeout (busy, or hung) once.
DOWN_AFTER_FAILURES = 3
_EWMA = 0.2  # weight of the newest queue-delay sample


@dataclass(eq=False)
class Member:
    url: str
    client: ReplicaClient
    info: WorkerInfo | None = None
    healthy: bool = False
    failures: int = 0
    refused: bool = False  # the latest failure was a refused connection (nothing listens)
    last_output: float = 0.0  # time.monotonic() of the latest output or KV event batch from it
    load: WorkerLoad | None = None
    local_tokens: int = 0  # outstanding tokens of this gateway's requests on it
    other_tokens: int = 0  # other gateways' share at the last load poll
    queue_delay_s: float = 0.0  # EWMA of engine queue time of requests it served for us
    routed: Counter[str] = field(default_factory=Counter)  # routing reason -> requests
    inflight: int = 0
    # this gateway's outstanding tokens on it per tenant (GenerateOptions.tenant): the router
    # spreads one tenant's burst over its placement set by them
    tenant_tokens: Counter[str] = field(default_factory=Counter)

    @property
    def worker_id(self) -> str:
        return self.info.worker_id if self.info is not None else self.url

    @property
    def cost(self) -> int:
        """Outstanding tokens on the worker: ours (exact) + the others' (one poll old)."""
        return self.local_tokens + self.other_tokens

    def tenant_cost(self, tenant: str) -> int:
        """What a request of ``tenant`` sees: the worker's outstanding tokens, with the
        tenant's own counted twice (its requests on one worker compete with each other for
        that engine's fair share; elsewhere they would not)."""
        return self.cost + self.tenant_tokens.get(tenant, 0)

    def add_work(self, tenant: str, cost: int) -> None:
        self.local_tokens += cost
        self.inflight += 1
        self.tenant_tokens[tenant] += cost

    def end_work(self, tenant: str, cost: int) -> None:
        self.local_tokens -= cost
        self.inflight -= 1
        left = self.tenant_tokens[tenant] - cost
        if left > 0:
            self.tenant_tokens[tenant] = left
        else:
            del self.tenant_tokens[tenant]

    def observed(self, load: WorkerLoad) -> None:
        self.load = load
        self.other_tokens = max(0, load.outstanding_tokens - self.local_tokens)

    def record_queue_delay(self, seconds: float) -> None:
        self.queue_delay_s += _EWMA * (max(0.0, seconds) - self.queue_delay_s)

    def failed(self, *, refused: bool = False) -> bool:
        """Count a failed check; True when this takes a healthy worker out."""
        self.failures += 2 if refused else 1
        if self.healthy and self.failures >= DOWN_AFTER_FAILURES:
            self.healthy = False
            return True
        return False

    def check_integrity(self) -> None:
        assert self.local_tokens >= 0 and self.inflight >= 0, f"{self.url}: negative load"
        assert all(n > 0 for n in self.tenant_tokens.values()), f"{self.url}: tenant tokens"
        assert sum(self.tenant_tokens.values()) == self.local_tokens, f"{self.url}: tenant sum"
        assert not self.healthy or self.info is not None, f"{self.url}: healthy without info"
