"""The TTFT bench's reader: chunked transfer decoding and SSE events, timed at the recv that
completed them, whatever way the bytes are cut."""

from __future__ import annotations

import json

from bench.gateway_ttft import _Events


def _chunk(payload: bytes) -> bytes:
    return f"{len(payload):x}\r\n".encode() + payload + b"\r\n"


def _event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


ROLE = {"choices": [{"index": 0, "delta": {"role": "assistant"}}]}
CONTENT = {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}
USAGE = {
    "choices": [],
    "usage": {"prompt_tokens": 784, "prompt_tokens_details": {"cached_tokens": 768}},
}
BODY = (
    _chunk(_event(ROLE))
    + _chunk(_event(CONTENT))
    + _chunk(_event(USAGE))
    + _chunk(b"data: [DONE]\n\n")
    + b"0\r\n\r\n"
)


def _read(pieces: list[bytes]) -> _Events:
    events, buf = _Events(), b""
    for t, piece in enumerate(pieces):
        buf = events.feed(buf + piece, float(t))
    return events


def test_one_recv_gives_every_event_its_time() -> None:
    events = _read([BODY])
    assert (events.role_s, events.content_s) == (0.0, 0.0)
    assert (events.prompt, events.cached, events.done, events.ended) == (784, 768, True, True)


def test_an_event_is_timed_when_its_last_byte_arrives() -> None:
    role = len(_chunk(_event(ROLE)))
    cut = role + 5  # inside the content chunk's payload
    events = _read([BODY[:cut], BODY[cut:]])
    assert (events.role_s, events.content_s) == (0.0, 1.0)


def test_byte_by_byte() -> None:
    pieces = [BODY[i : i + 1] for i in range(len(BODY))]
    events = _read(pieces)
    first_content_end = len(_chunk(_event(ROLE))) + len(_chunk(_event(CONTENT))) - 1
    assert events.content_s == float(first_content_end)  # a chunk is whole with its CRLF
    assert events.ended and events.done


def test_not_ended_before_the_last_chunk() -> None:
    events = _read([BODY[:-5]])
    assert events.done and not events.ended
