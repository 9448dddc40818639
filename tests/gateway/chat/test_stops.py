"""The incremental stop matcher equals a full search of everything fed so far, at every step:
the same text emitted, the same hold-back of a possible stop prefix, the same stop found."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gateway.chat.stops import StopMatcher

PROPERTY = settings(max_examples=600, deadline=None, derandomize=True, database=None)

# A small alphabet, so that stops occur, overlap and almost-occur often.
TEXT = st.text(alphabet="abc\u00e9\n", max_size=12)
STOPS = st.lists(st.text(alphabet="abc\u00e9\n", min_size=1, max_size=6), max_size=4)


class NaiveMatcher:
    """Today's semantics spelled out: search the whole text so far for every stop, each step."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.text = ""
        self.emitted = 0

    def feed(self, piece: str) -> tuple[str, bool]:
        self.text += piece
        hits = [i for i in (self.text.find(s) for s in self.stops) if i >= 0]
        end = min(hits) if hits else max(self.emitted, len(self.text) - self.hold)
        out, self.emitted = self.text[self.emitted : end], end
        return out, bool(hits)

    def flush(self) -> str:
        out, self.emitted = self.text[self.emitted :], len(self.text)
        return out


@PROPERTY
@given(stops=STOPS, pieces=st.lists(TEXT, max_size=12))
def test_incremental_matcher_equals_the_full_search(stops: list[str], pieces: list[str]) -> None:
    fast, naive = StopMatcher(stops), NaiveMatcher(stops)
    stopped = False
    for piece in pieces:
        got = fast.feed(piece)
        assert got == naive.feed(piece), (stops, pieces)
        if got[1]:
            stopped = True
            break
    if not stopped:
        assert fast.flush() == naive.flush()


@PROPERTY
@given(stops=STOPS, text=st.text(alphabet="abc\u00e9\n", max_size=60), data=st.data())
def test_any_chunking_gives_the_answer_of_one_search(
    stops: list[str], text: str, data: st.DataObject
) -> None:
    """However the text is cut into pieces, the emitted text is the text up to the earliest
    stop string (all of it when there is none). When one stop string lies inside another, the
    one that completes first in the stream wins (the first test pins that exact rule), so this
    holds for stop sets where none contains another."""
    assume(not any(a != b and a in b for a in stops for b in stops))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=10)))
    edges = [0, *cuts, len(text)]
    m, out, hit = StopMatcher(stops), "", False
    for a, b in pairwise(edges):
        piece, hit = m.feed(text[a:b])
        out += piece
        if hit:
            break
    if not hit:
        out += m.flush()
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    assert (out, hit) == ((text[: min(hits)], True) if hits else (text, False))
