"""Sequence numbers of one KV-event publisher: what to deliver, skip or fetch again.

vLLM numbers its messages 0, 1, 2, ... per publisher process and keeps the last ``buffer_steps``
of them for replay. ZMQ's PUB/SUB drops messages while a subscriber is disconnected or slow, so
each live message is judged against ``next_seq``, the first number not yet delivered::

    live seq <= last live seq        the counter went back: a new publisher process (RESTART);
                                     what was known of the server is void, replay from 0
    live seq <  next_seq             already delivered by a replay (SKIP)
    live seq == next_seq             DELIVER
    live seq >  next_seq             GAP: replay from next_seq first

Every message about to be delivered, live or replayed, then goes through ``take``: a number
below ``next_seq`` is a duplicate, one above it means messages were lost for good (the replay
buffer no longer had them), so the server's state is unknown and is cleared by the caller.
Pure logic: the sockets are ``kv_subscriber.py``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Verdict(Enum):
    DELIVER = "deliver"
    SKIP = "skip"
    GAP = "gap"
    RESTART = "restart"


class Take(Enum):
    NEXT = "next"  # the expected message: deliver
    AFTER_LOSS = "after_loss"  # deliver, after clearing: messages before it are lost
    DUPLICATE = "duplicate"  # delivered before: drop


@dataclass(slots=True)
class SequenceTracker:
    """``start_seq``: the history wanted before the first live message (0: all the publisher
    still buffers; None: none). ``next_seq`` is None until the first message."""

    start_seq: int | None = 0
    next_seq: int | None = None
    last_live: int | None = None

    def on_live(self, seq: int) -> Verdict:
        """Judge a message received on the SUB socket."""
        last, self.last_live = self.last_live, seq
        if last is not None and seq <= last:
            self.next_seq = 0
            return Verdict.RESTART
        if self.next_seq is None:
            self.next_seq = seq if self.start_seq is None else min(self.start_seq, seq)
        if seq < self.next_seq:
            return Verdict.SKIP
        return Verdict.DELIVER if seq == self.next_seq else Verdict.GAP

    def wanted(self) -> int:
        """Where a replay should start."""
        if self.next_seq is not None:
            return self.next_seq
        return self.start_seq if self.start_seq is not None else 0

    def take(self, seq: int) -> Take:
        """Account for ``seq`` about to be delivered (see the module docstring)."""
        if self.next_seq is None:
            self.next_seq = seq if self.start_seq is None else self.start_seq
        if seq < self.next_seq:
            return Take.DUPLICATE
        lost = seq > self.next_seq
        self.next_seq = seq + 1
        return Take.AFTER_LOSS if lost else Take.NEXT

    def restart(self) -> None:
        """Forget everything: the next replay starts from 0 (``KVEventSubscriber.resync``)."""
        self.next_seq = 0
        self.last_live = None
