"""Tool calls out of a model's answer, incrementally: the same parser streams and completes.

``feed`` takes the answer's text as it is decoded and returns what is now certain: content text
and call deltas (a call's id and name once its name is complete, then its arguments in
fragments, exactly as the model writes them). ``close`` ends the answer. A non-streamed answer
is one ``feed`` and a ``close``: the same calls, the same content.

    text mode     content; the tail that may begin the opening tag is held back (a tag split
                  across tokens), and so is trailing whitespace (the newlines between calls are
                  not content)
    call mode     the block's JSON goes to a ``CallScanner``; when it ends, the closing tag is
                  skipped and text mode resumes (Hermes: another block may follow)
    Llama 3       no tag: an answer whose first non-space character is ``{`` is calls
                  (``;``-separated), any other answer is all content

A block that is not calls (no grammar held the model to the format, and it wrote ``<tool_call>``
and then prose) is given back as content, tag included, when that is known before any call of
it was sent. Content is the text outside the calls; with calls, its surrounding whitespace is
dropped, without calls it is the answer's text exactly.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from gateway.chat.tools.formats import ToolFormat
from gateway.chat.tools.scanner import WS, CallScanner, ScannedCall


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class CallDelta:
    """A streamed change of call ``index``: ``id`` and ``name`` on its first delta only."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None

    def body(self) -> dict[str, object]:
        """The ``delta.tool_calls[]`` entry OpenAI streams."""
        fn: dict[str, object] = {"arguments": self.arguments}
        out: dict[str, object] = {"index": self.index}
        if self.id is not None:
            out.update(id=self.id, type="function")
            fn = {"name": self.name, **fn}
        out["function"] = fn
        return out


@dataclass
class ToolCall:
    """One call; ``complete`` once the model closed its object (a call cut by ``max_tokens``
    never is: the gateway never runs such a call)."""

    id: str
    name: str
    arguments: str = ""
    complete: bool = False

    def body(self) -> dict[str, object]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass
class Parsed:
    """What one ``feed`` or ``close`` made certain."""

    content: str = ""
    deltas: list[CallDelta] = field(default_factory=list)


@dataclass
class _Block:
    scanner: CallScanner
    raw: str  # the text of the block so far, opening tag included
    first: int  # index of the block's first call among all calls
    sent: dict[int, int] = field(default_factory=dict)  # scanned call -> argument chars sent


class ToolCallParser:
    def __init__(self, fmt: ToolFormat) -> None:
        self.fmt = fmt
        self.calls: list[ToolCall] = []
        self._content: list[str] = []
        self._space = ""  # trailing whitespace of the content: sent only if content follows
        self._held = ""  # text mode: the end that may begin the opening tag; after: the closing
        self._block: _Block | None = None
        self._after = False  # a block's JSON ended: its closing tag comes next
        self._plain = False  # Llama 3: the answer (or its rest) is not calls: all content
        self._started = False
        if fmt.primed and fmt.open is not None:  # the opening was the prompt's: a block is open
            self._block = self._new_block(fmt.primer)

    @property
    def content(self) -> str | None:
        text = "".join(self._content)
        if not self.calls:
            return text
        return text.strip() or None

    def feed(self, text: str) -> Parsed:
        out = Parsed()
        while text:
            if self._block is not None:
                text = self._feed_block(self._block, text, out)
            elif self._after:
                text = self._skip_close(text)
            elif self._plain:
                self._text(text, out)
                text = ""
            elif self.fmt.open is None:
                text = self._feed_bare(text, out)
            else:
                text = self._feed_text(self.fmt.open, text, out)
        return out

    def close(self) -> Parsed:
        out = Parsed()
        block, self._block = self._block, None
        if block is not None and not self._has_calls(block):
            self._text(block.raw, out)  # an unfinished block that held no call: text
        if not self._after:
            self._text(self._held, out)
        self._held = ""
        if not self.calls and self._space:  # without calls the content is the text exactly
            self._content.append(self._space)
            out.content += self._space
        self._space = ""
        return out

    def _feed_text(self, tag: str, text: str, out: Parsed) -> str:
        buf, self._held = self._held + text, ""
        at = buf.find(tag)
        if at >= 0:
            self._text(buf[:at], out)
            self._block = self._new_block(tag)
            return buf[at + len(tag) :]
        keep = _partial_suffix(buf, tag)
        self._text(buf[: len(buf) - keep], out)
        self._held = buf[len(buf) - keep :]
        return ""

    def _feed_bare(self, text: str, out: Parsed) -> str:
        """Llama 3: the first non-space character decides whether the answer is calls."""
        buf, self._held = self._held + text, ""
        lead = len(buf) - len(buf.lstrip(WS))
        if lead == len(buf):
            self._held = buf
            return ""
        if buf[lead] != "{":
            self._plain = True
            self._text(buf, out)
            return ""
        self._block = self._new_block(buf[:lead])
        return buf[lead:]

    def _new_block(self, raw: str) -> _Block:
        depth = 2 if self.fmt.array else 1
        scanner = CallScanner(depth, self.fmt.args_key, repeat=self.fmt.open is None)
        return _Block(scanner, raw, len(self.calls))

    def _feed_block(self, block: _Block, text: str, out: Parsed) -> str:
        scanner = block.scanner
        scanner.feed(text)
        block.raw += text
        if scanner.failed and not self._has_calls(block):
            self._block = None  # not calls after all: the block is text
            self._text(block.raw, out)
            self._plain = self.fmt.open is None
            return ""
        self._send(block, out)
        if scanner.failed:  # broken after a call was sent: what follows is text
            self._block = None
            self._plain = True
            return ""
        if scanner.done:
            self._block = None
            self._after = self.fmt.close is not None
            self._plain = self.fmt.open is None
            return scanner.rest
        return ""

    def _has_calls(self, block: _Block) -> bool:
        return len(self.calls) > block.first

    def _send(self, block: _Block, out: Parsed) -> None:
        text = block.scanner.text
        for k, scanned in enumerate(block.scanner.calls):
            index = block.first + k
            if index == len(self.calls):
                if scanned.name is None:
                    return  # calls are sent in order, each starting with its name
                call = ToolCall(new_call_id(), scanned.name)
                self.calls.append(call)
                self._space = ""  # whitespace before a call is not content
                out.deltas.append(CallDelta(index, "", call.id, call.name))
            fragment = self._new_arguments(block, k, scanned, text)
            if fragment:
                self.calls[index].arguments += fragment
                out.deltas.append(CallDelta(index, fragment))
            self.calls[index].complete = scanned.closed

    def _new_arguments(self, block: _Block, k: int, scanned: ScannedCall, text: str) -> str:
        sent = block.sent.get(k, 0)
        if scanned.args_start is None:
            if scanned.closed and sent == 0:  # a call without arguments: an empty object
                block.sent[k] = 2
                return "{}"
            return ""
        end = scanned.args_end if scanned.args_end is not None else len(text)
        fragment = text[scanned.args_start + sent : end]
        block.sent[k] = sent + len(fragment)
        return fragment

    def _skip_close(self, text: str) -> str:
        assert self.fmt.close is not None
        buf, self._held = (self._held + text).lstrip(WS), ""
        if buf.startswith(self.fmt.close):
            self._after = False
            return buf[len(self.fmt.close) :]
        if self.fmt.close.startswith(buf):
            self._held = buf  # the tag is still being written
            return ""
        self._after = False  # no closing tag: what follows is text
        return buf

    def _text(self, text: str, out: Parsed) -> None:
        """Content; its trailing whitespace waits for more content (``_space``)."""
        body = text.rstrip(WS)
        if not body:
            self._space += text
            return
        text, self._space = self._space + body, text[len(body) :]
        self._content.append(text)
        out.content += text


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that begins ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
