"""What a worker reports as its load: requests waiting / running and outstanding tokens.

Counted by the worker's API layer from the streams it serves (no engine internals): a request is
*waiting* until its first output arrives and *running* after; its outstanding tokens are the
prompt tokens not yet served plus the output tokens not yet generated (the router's cost unit).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Tracked:
    prompt: int
    max_tokens: int
    generated: int = 0
    running: bool = False

    @property
    def outstanding(self) -> int:
        return (0 if self.running else self.prompt) + self.max_tokens - self.generated


class LoadTracker:
    def __init__(self) -> None:
        self._requests: dict[str, _Tracked] = {}
        self.served = 0  # requests finished (any way)

    def add(self, request_id: str, prompt_tokens: int, max_tokens: int) -> None:
        self._requests[request_id] = _Tracked(prompt_tokens, max_tokens)

    def advance(self, request_id: str, num_generated: int) -> None:
        t = self._requests.get(request_id)
        if t is not None:
            t.running = True
            t.generated = num_generated

    def finish(self, request_id: str) -> None:
        if self._requests.pop(request_id, None) is not None:
            self.served += 1

    def snapshot(self) -> dict[str, int]:
        running = sum(1 for t in self._requests.values() if t.running)
        return {
            "running": running,
            "waiting": len(self._requests) - running,
            "outstanding_tokens": sum(t.outstanding for t in self._requests.values()),
            "served": self.served,
        }

    def check_integrity(self) -> None:
        for rid, t in self._requests.items():
            assert 0 <= t.generated <= t.max_tokens, f"{rid}: generated {t.generated}"
            assert t.outstanding >= 0, f"{rid}: negative outstanding tokens"
