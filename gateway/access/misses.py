"""``RecentMisses``: keys a database read just found missing, answered without a read for a while.

Unknown API keys, made-up tenant ids in forged session tokens and tenants without a session
secret are all input anyone can send; without this every such request is a database read. A
miss is remembered for ``ttl_s`` (briefly: a key created on another replica whose change event
this one missed is refused for at most that long), at most ``max_size`` of them (the oldest are
forgotten first), and forgotten at once by the change events that may turn it into a hit::

    read -> None ──add──▶ missing until now + ttl_s ──forget (event) / expiry / eviction──▶ gone

A read that overlapped a ``forget`` records nothing: its answer may predate the change
(``generation`` is read before the read and checked by ``add``).
"""

from __future__ import annotations

from collections import OrderedDict


class RecentMisses:
    def __init__(self, ttl_s: float, max_size: int = 10_000) -> None:
        assert ttl_s >= 0 and max_size >= 0, "bad miss cache bounds"
        self._ttl = ttl_s
        self._max = max_size
        self._until: OrderedDict[str, float] = OrderedDict()  # key -> missing until (clock)
        self.generation = 0  # bumped by every forget

    def __len__(self) -> int:
        return len(self._until)

    def missing(self, key: str, now: float) -> bool:
        """Whether ``key`` was found missing less than ``ttl_s`` ago (no event since)."""
        until = self._until.get(key)
        if until is None:
            return False
        if now < until:
            return True
        del self._until[key]
        return False

    def add(self, key: str, now: float, generation: int) -> None:
        """Remember a miss read while ``generation`` was current (else: ignored)."""
        if generation != self.generation or self._ttl == 0 or self._max == 0:
            return
        self._until[key] = now + self._ttl
        self._until.move_to_end(key)
        while len(self._until) > self._max:
            self._until.popitem(last=False)

    def discard(self, key: str) -> None:
        """Drop ``key``'s miss: a read found it after all (no event: the generation stays)."""
        self._until.pop(key, None)

    def forget(self, key: str | None = None) -> None:
        """Forget one key's miss, or every miss (``key`` None)."""
        self.generation += 1
        if key is None:
            self._until.clear()
        else:
            self._until.pop(key, None)

    def check_integrity(self, now: float) -> None:
        assert len(self._until) <= self._max, "more misses remembered than the bound"
        for key, until in self._until.items():
            assert until <= now + self._ttl, f"miss {key[:8]} remembered beyond the TTL"
