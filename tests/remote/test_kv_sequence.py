"""The sequence rules of one KV-event publisher (engine/remote/kv_sequence.py)."""

from __future__ import annotations

from engine.remote.kv_sequence import SequenceTracker, Take, Verdict


def test_in_order_messages_are_delivered() -> None:
    t = SequenceTracker(start_seq=None)
    for seq in (5, 6, 7):
        assert t.on_live(seq) is Verdict.DELIVER
        assert t.take(seq) is Take.NEXT
    assert t.wanted() == 8


def test_history_asked_at_start_makes_the_first_live_message_a_gap() -> None:
    t = SequenceTracker(start_seq=0)
    assert t.wanted() == 0
    assert t.on_live(3) is Verdict.GAP
    assert [t.take(s) for s in (0, 1, 2)] == [Take.NEXT] * 3  # the replay
    assert t.take(3) is Take.NEXT


def test_replayed_messages_make_later_live_ones_duplicates() -> None:
    t = SequenceTracker(start_seq=0)
    assert [t.take(s) for s in (0, 1, 2, 3)] == [Take.NEXT] * 4  # a replay at connect
    assert t.on_live(2) is Verdict.SKIP
    assert t.on_live(3) is Verdict.SKIP
    assert t.on_live(4) is Verdict.DELIVER


def test_a_gap_the_replay_cannot_fill_is_a_loss() -> None:
    t = SequenceTracker(start_seq=None)
    assert t.on_live(0) is Verdict.DELIVER and t.take(0) is Take.NEXT
    assert t.on_live(5) is Verdict.GAP
    assert t.wanted() == 1
    assert t.take(3) is Take.AFTER_LOSS  # the buffer had dropped 1 and 2
    assert t.take(4) is Take.NEXT
    assert t.take(5) is Take.NEXT
    assert t.take(4) is Take.DUPLICATE


def test_a_counter_that_goes_back_is_a_restart() -> None:
    t = SequenceTracker(start_seq=None)
    for seq in (0, 1, 2):
        t.on_live(seq)
        t.take(seq)
    assert t.on_live(1) is Verdict.RESTART
    assert t.wanted() == 0
    assert t.take(0) is Take.NEXT and t.take(1) is Take.NEXT
    assert t.on_live(2) is Verdict.DELIVER


def test_restart_forgets_everything() -> None:
    t = SequenceTracker(start_seq=None)
    t.on_live(9)
    t.take(9)
    t.restart()
    assert t.wanted() == 0 and t.last_live is None
    assert t.on_live(4) is Verdict.GAP
