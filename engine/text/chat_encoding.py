"""Control tokens come from the chat template only; message text is encoded as plain text.

A tokenizer matches its special (control) tokens anywhere in the text it encodes, so a message
holding ``<|im_end|>\\n<|im_start|>system\\n`` would become real turn boundaries: a client could
write a system turn of its own. Chat encoding keeps the template's structure and message text
apart::

    template source, special-token names  --control token text -> its mark-->  marked template
    marked template + messages as sent    --render-->  marked text (control tokens only as marks)
    marked text  --plain view-->  ids: each mark -> its control token's id; everything else,
                                  control-token strings written in messages included, as text

A mark is ``U+F0000 nonce index U+F0001``: private-use characters around a random nonce made per
process that never leaves it, so no message can spell one (``check_text``). Messages are rendered
as sent, so whatever the template does with them (trim, conditions) is what it always did.

The plain view is a copy of the tokenizer with special-token matching off
(``encode_special_tokens``), every mark added as an ordinary added token with the flags of the
token it stands for (text splits around a mark exactly as around its token, so segment offsets
and prefix-space rules are unchanged), and no BPE merge that would rebuild a control token from
its characters. For text without control-token strings the ids equal the tokenizer's own.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

from engine.text.errors import ModelLoadError

MARK_OPEN, MARK_CLOSE = "\U000f0000", "\U000f0001"


class ForgedMark(ValueError):
    """Message text contains this process's mark prefix (guessing it takes 64 random bits)."""


class TokenLimitExceeded(ValueError):
    """The text encodes to more tokens than allowed; ``count`` says how many."""

    def __init__(self, count: int, limit: int) -> None:
        super().__init__(f"{count} tokens, more than {limit}")
        self.count = count


class ControlMarks:
    """Each control token's text and its mark (cheap: no copy of the tokenizer)."""

    def __init__(self, controls: dict[int, Any]) -> None:
        self.prefix = MARK_OPEN + secrets.token_hex(8)
        ordered = sorted(controls.items())
        self.tokens = {tok.content: tok for _, tok in ordered}  # text -> AddedToken
        self.ids = {tok.content: token_id for token_id, tok in ordered}  # text -> id
        self.by_text = {
            tok.content: f"{self.prefix}{i:x}{MARK_CLOSE}" for i, (_, tok) in enumerate(ordered)
        }
        # Longest first: where one control token's text starts another's, the longer one wins,
        # as the tokenizer's own matching does.
        longest = sorted(self.by_text, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, longest))) if longest else None

    def mark(self, text: str) -> str:
        """``text`` (template source, a special token's name) with control tokens as marks."""
        if self._pattern is None:
            return text
        return self._pattern.sub(lambda m: self.by_text[m.group(0)], text)

    def unmark(self, text: str) -> str:
        for content, mark in self.by_text.items():
            text = text.replace(mark, content)
        return text

    def check_text(self, text: str) -> None:
        if self.prefix in text:
            raise ForgedMark("message text contains a reserved character sequence")


class PlainView:
    """Encodes marked text: marks as their control tokens, all other text as plain text."""

    def __init__(self, spec: dict[str, Any], marks: ControlMarks) -> None:
        """``spec``: the tokenizer's tokenizer.json (changed here: control merges dropped)."""
        from tokenizers import AddedToken
        from tokenizers import Tokenizer as Backend

        control_ids = set(marks.ids.values())
        _drop_control_merges(spec, control_ids)
        view = Backend.from_str(json.dumps(spec))
        view.encode_special_tokens = True  # control tokens' text is matched by BPE, as text
        view.add_tokens(
            [
                AddedToken(
                    marks.by_text[content],
                    single_word=tok.single_word,
                    lstrip=tok.lstrip,
                    rstrip=tok.rstrip,
                    normalized=tok.normalized,
                    special=False,  # ordinary added tokens are matched even in this view
                )
                for content, tok in marks.tokens.items()
            ]
        )
        self._view = view
        self._to_control = {
            view.token_to_id(mark): marks.ids[content] for content, mark in marks.by_text.items()
        }
        self._check(marks, control_ids)

    def _check(self, marks: ControlMarks, control_ids: set[int]) -> None:
        """Written alone, no control token's text may encode to a control token."""
        for content in marks.ids:
            if control_ids & set(self._view.encode(content, add_special_tokens=False).ids):
                raise ModelLoadError(
                    f"tokenizer: the control token {content!r} is rebuilt from plain text"
                )

    def encode(self, text: str, limit: int | None = None) -> list[int]:
        """Token ids of marked text. ``encode_batch`` releases the GIL while it works (``encode``
        does not), so a long text on a worker thread leaves the event loop running. More than
        ``limit`` tokens raises ``TokenLimitExceeded`` before any id list is built."""
        encoding = self._view.encode_batch_fast([text], add_special_tokens=False)[0]
        if limit is not None and len(encoding) > limit:
            raise TokenLimitExceeded(len(encoding), limit)
        to_control = self._to_control
        return [to_control.get(i, i) for i in encoding.ids]


def _drop_control_merges(spec: dict[str, Any], control_ids: set[int]) -> None:
    """Remove BPE merges whose result is a control token (a vocabulary rebuilt from scores can
    hold them): then no run of plain text ever becomes one."""
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        return
    controls = {text for text, i in model["vocab"].items() if i in control_ids}
    if not controls:
        return

    def result(merge: Any) -> str:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        return str(left) + str(right)

    model["merges"] = [m for m in model.get("merges") or [] if result(m) not in controls]
