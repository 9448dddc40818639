"""Where the calls are in JSON text that is still being written.

A tool call's ``arguments`` go to the client as the model wrote them, in fragments, while the
model writes them: that needs the span of one value inside an unfinished JSON document, which
JSON parsers (complete or partial) do not give. ``CallScanner`` follows the document's
structure only (strings and their escapes, brackets, keys and values of the call objects) and
reports, per call object, its ``name`` once the string is complete and the raw text of its
arguments value as it grows; values are not checked (the grammar makes them valid where it is
enforced; the gateway forwards what the model wrote, as OpenAI does).

Call objects sit at ``call_depth``: 1 for bare objects (one per Hermes block; Llama 3's answer,
several separated by ``;`` when ``repeat``), 2 inside an array (SmolLM2). Anything else where a
call belongs fails the scan (``failed``); text after the document is ``rest``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

WS = " \t\r\n"


@dataclass
class ScannedCall:
    name: str | None = None
    args_start: int | None = None  # offset of the arguments value in the scanned text
    args_end: int | None = None  # its end (exclusive) once complete
    closed: bool = False


@dataclass
class _Value:
    kind: str  # "container", "string" or "literal" (number, true, false, null)
    role: str  # "name", "args" or "other"
    depth: int  # containers: the depth the value's closing bracket returns to


@dataclass
class CallScanner:
    call_depth: int
    args_key: str
    repeat: bool = False
    text: str = ""
    calls: list[ScannedCall] = field(default_factory=list)
    failed: bool = False
    done: bool = False
    rest: str = ""
    _stack: list[str] = field(default_factory=list)
    _in_str: bool = False
    _esc: bool = False
    _capture: list[str] | None = None  # the raw text of a key or name string being read
    _key_next: bool = False  # in a call object, the next string is a key
    _key: str | None = None
    _await_value: bool = False
    _value: _Value | None = None
    _started: bool = False

    def feed(self, chunk: str) -> None:
        start = len(self.text)
        self.text += chunk
        for i, ch in enumerate(chunk, start):
            if self.done or self.failed:
                if self.done:
                    self.rest += ch
                continue
            self._char(i, ch)

    @property
    def open_args(self) -> tuple[ScannedCall, int] | None:
        """The call whose arguments are being written and how far they go now."""
        if self.calls and self._value is not None and self._value.role == "args":
            return self.calls[-1], len(self.text)
        return None

    def _char(self, i: int, ch: str) -> None:
        if self._in_str:
            self._string_char(i, ch)
            return
        value = self._value
        if value is not None and value.kind == "literal":
            if ch not in WS and ch not in ",}]":
                return
            self._end_value(i)  # the terminator is not part of the literal
        if self._await_value and ch not in WS:
            self._start_value(i, ch)
        self._structure(i, ch)

    def _string_char(self, i: int, ch: str) -> None:
        if self._capture is not None:
            self._capture.append(ch)
        if self._esc:
            self._esc = False
        elif ch == "\\":
            self._esc = True
        elif ch == '"':
            self._in_str = False
            self._string_done(i)

    def _string_done(self, i: int) -> None:
        if self._capture is not None:
            text = "".join(self._capture)
            self._capture = None
            value = self._value
            if value is not None and value.role == "name" and value.kind == "string":
                self.calls[-1].name = _decode(text)
                self._value = None
            else:  # a key of the call object
                self._key = _decode(text)
                self._key_next = False
            return
        value = self._value
        if value is not None and value.kind == "string":
            self._end_value(i + 1)

    def _start_value(self, i: int, ch: str) -> None:
        self._await_value = False
        role = {"name": "name", self.args_key: "args"}.get(self._key or "", "other")
        kind = "container" if ch in "{[" else "string" if ch == '"' else "literal"
        self._value = _Value(kind, role, len(self._stack))
        if role == "args":
            self.calls[-1].args_start = i

    def _end_value(self, end: int) -> None:
        value, self._value = self._value, None
        if value is not None and value.role == "args":
            self.calls[-1].args_end = end

    def _structure(self, i: int, ch: str) -> None:
        depth = len(self._stack)
        if ch in "{[":
            self._open(ch, depth)
        elif ch in "}]":
            self._close(i, ch, depth)
        elif depth < self.call_depth:
            if ch not in WS:
                self._outside(ch, depth)
        elif ch == '"':
            self._in_str = True
            value = self._value
            key = value is None and self._key_next
            if depth == self.call_depth and (key or (value is not None and value.role == "name")):
                self._capture = [ch]
        elif depth == self.call_depth and self._value is None:
            if ch == ",":
                self._key_next = True
            elif ch == ":" and self._key is not None:
                self._await_value = True

    def _open(self, ch: str, depth: int) -> None:
        if depth == self.call_depth - 1:
            if ch != "{":
                self.failed = True
                return
            self.calls.append(ScannedCall())
            self._key_next, self._key = True, None
        elif depth < self.call_depth - 1 and ch != "[":
            self.failed = True
            return
        self._started = True
        self._stack.append(ch)

    def _close(self, i: int, ch: str, depth: int) -> None:
        if not self._stack or {"}": "{", "]": "["}[ch] != self._stack[-1]:
            self.failed = True
            return
        self._stack.pop()
        value = self._value
        if value is not None and value.kind == "container" and len(self._stack) == value.depth:
            self._end_value(i + 1)
        if depth == self.call_depth:  # a call object closed
            self.calls[-1].closed = True
            self._key = None
        if not self._stack and not self.repeat:
            self.done = True

    def _outside(self, ch: str, depth: int) -> None:
        """A character between call objects (or before the first)."""
        if depth > 0 and ch == ",":  # between the calls of an array
            return
        if self.repeat and depth == 0 and self._started:
            if ch != ";":  # the calls are over: the rest is text
                self.done = True
                self.rest += ch
            return
        self.failed = True


def _decode(raw: str) -> str:
    try:
        value = json.loads(raw)
    except ValueError:
        return raw.strip('"')
    return value if isinstance(value, str) else raw
