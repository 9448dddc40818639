"""Stop strings over streamed text, searched incrementally.

To never emit a stop string's beginning before knowing whether it completes, the last
``max(len(stop)) - 1`` characters are held back::

    decoded so far:  | emitted ............ | held back (< longest stop) |
    a stop found at i: emit text[:i], finish "stop"

Invariant: no stop string occurs in what was fed so far (else the matcher has stopped). So a
stop string can only end inside the newest text, and stop ``s`` is searched from
``len(held) - len(s) + 1`` on: the new text plus at most ``len(s) - 1`` held characters. A feed
costs O(len(text) + longest stop) per stop string, however long the answer already is; with
the request bounds (4 stops of at most 256 characters, gateway/chat/bounds.py) that is a few
microseconds per token. The result is exactly that of searching everything fed so far (the
earliest occurrence of any stop string), which the property test checks.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    def __init__(self, stops: Sequence[str]) -> None:
        assert all(stops), "stop strings are never empty (refused at parse)"
        self._stops = tuple(stops)
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._buffer = ""  # the held-back tail: at most ``_hold`` characters

    def feed(self, text: str) -> tuple[str, bool]:
        """Text that is safe to emit now, and whether a stop string was reached."""
        held = len(self._buffer)
        buf = self._buffer + text
        first = -1
        for stop in self._stops:
            at = buf.find(stop, max(0, held - len(stop) + 1))
            if at >= 0 and (first < 0 or at < first):
                first = at
        if first >= 0:
            self._buffer = ""
            return buf[:first], True
        cut = max(0, len(buf) - self._hold)
        self._buffer = buf[cut:]
        return buf[:cut], False

    def flush(self) -> str:
        out, self._buffer = self._buffer, ""
        return out

    @property
    def active(self) -> bool:
        return bool(self._stops)
