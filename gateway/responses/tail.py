"""Warm tails: a stored conversation's next turn starts with exactly the tokens the engine
computed for the last one, so the prefix cache serves everything up to the new input.

    stored tail (turn k)  = prompt ids after the tenant prefix ++ answer ids (its EOS dropped)
    prompt (turn k+1)     = prefix ids ++ tail ++ encode_marked(suffix)
    suffix                = what the template writes after the last answer's text: its end
                            of turn, the new input's turns, the generation prompt

The suffix is cut from a rendering of the whole conversation with a marker as the last answer
(gateway/chat/tools/continuation.py does the same for a tool round), so the template decides
every byte of it and client text in it is plain text. Re-rendering the history instead would
re-encode the answer's text, which need not give the tokens the model produced (a different
split misses the cache from there on).

A tail is used only while it continues the same thing: ``digest`` covers the tenant prefix ids,
the instructions, the tools and the output format of the turn that stored it. Otherwise (or when
the template does not write the marker verbatim) the prompt is assembled as chat assembles it;
blocks it shares with the stored turn still hit the cache.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from engine.text.chat_encoding import ForgedMark
from engine.text.chat_template import TemplateError
from engine.text.tokenizer import Tokenizer
from gateway.chat.messages import ChatMessage
from gateway.chat.schemas import ChatRequest
from gateway.chat.tools.models import ToolDef
from gateway.chat.tools.plan import OutputPlan
from gateway.prompts.tenant_prefix import TenantPrefix
from tenants.conversation_records import Tail

MARKER = "@@kvgate-conversation-tail-5c1e@@"


def digest(prefix_ids: Sequence[int], body: ChatRequest, instructions: str | None) -> str:
    """What a tail must continue: the tenant prefix, instructions, tools, output format."""
    tools = [t.model_dump(mode="json") for t in body.tools or []]
    fmt = body.response_format.model_dump(mode="json") if body.response_format else None
    doc = json.dumps([list(prefix_ids), instructions, tools, fmt], separators=(",", ":"))
    return hashlib.sha256(doc.encode()).hexdigest()


@dataclass(frozen=True)
class TailPlan:
    """How to build one turn's prompt from a stored tail: the conversation as chat messages,
    ``answer_at`` the index of the last answer (replaced by the marker), the tail itself."""

    messages: tuple[ChatMessage, ...]
    answer_at: int
    tail: Tail

    def prompt(
        self,
        tok: Tokenizer,
        prefix: TenantPrefix,
        plan: OutputPlan,
        rendered: Sequence[ToolDef],
        turn_digest: str,
    ) -> list[int] | None:
        """The prompt ids, or None when the tail does not continue this turn (``turn_digest``:
        this turn's ``digest``)."""
        if self.tail.prefix_digest != turn_digest or not self.tail.ids:
            return None
        marked = list(self.messages)
        marked[self.answer_at] = ChatMessage(role="assistant", content=MARKER)
        rendering = plan.rendering(marked, rendered)
        convo = [*prefix.turns, *rendering.messages]
        extra = {**prefix.template_kwargs, **rendering.template_kwargs}
        try:
            full = tok.apply_chat_template(convo, add_generation_prompt=True, marked=True, **extra)
            at = full.rfind(MARKER)
            if at < 0 or full.count(MARKER) != 1 or not full.startswith(prefix.rendered):
                return None
            suffix = tok.encode_marked(full[at + len(MARKER) :])
        except (ForgedMark, TemplateError):
            return None  # the ordinary assembly gives the client its 400
        return [*prefix.ids, *self.tail.ids, *suffix]


def tail_of(
    tok: Tokenizer,
    prefix: TenantPrefix,
    prompt_ids: Sequence[int],
    answer_ids: Sequence[int],
    turn_digest: str,
    closing: Sequence[int] = (),
) -> Tail | None:
    """What the next turn continues from: the prompt after the prefix, then the answer (and
    ``closing``, the tokens that close a primed call block: gateway/chat/tools/plan.py)."""
    n = len(prefix.ids)
    if list(prompt_ids[:n]) != list(prefix.ids):
        return None  # tools moved into the system turn: no stable prefix to continue
    ids = list(answer_ids)
    if ids and ids[-1] in tok.eos_token_ids:
        ids.pop()  # the template writes its own end of turn
    return Tail(turn_digest, (*prompt_ids[n:], *ids, *closing))
