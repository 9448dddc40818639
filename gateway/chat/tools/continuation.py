"""The prompt of the next round of a gateway-run tool loop: the last prompt, the model's own
tokens, then only the tool results are new.

    next ids = last prompt ids ++ answer ids (its EOS dropped) ++ encode(suffix)
    suffix   = what the template writes after the assistant's text: its end of turn, the
               ``tool`` turns of this round's results, the generation prompt

The suffix is cut from a rendering of the conversation with a marker as the assistant's text
(so the template decides every byte of it, and a tool result is encoded as plain text: a
control-token string in it is a few ordinary tokens). Everything before the results is the
previous step's tokens exactly, so the prefix cache serves it (the answer's full blocks
included) and only the results are prefilled. A template that does not write the marker
verbatim falls back to a full rendering (the shared part is still served from the cache).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.text.chat_encoding import ForgedMark
from engine.text.tokenizer import Tokenizer
from gateway.chat.messages import ChatMessage
from gateway.chat.prompt import assemble
from gateway.chat.tools.models import ToolDef
from gateway.chat.tools.plan import OutputPlan
from gateway.prompts.tenant_prefix import TenantPrefix

MARKER = "@@kvgate-tool-continuation-7f3a@@"
REFUSED = '{"error": "tool_result_refused", "message": "the result holds reserved text"}'


def result_text(tok: Tokenizer, content: str) -> str:
    """A tool's answer as the model may read it (reserved control marks refused)."""
    try:
        tok.control_marks.check_text(content)
    except ForgedMark:
        return REFUSED
    return content


def tool_messages(results: Sequence[tuple[str, str]]) -> list[ChatMessage]:
    """``(call id, content)`` pairs as ``tool`` messages."""
    return [ChatMessage(role="tool", content=c, tool_call_id=i) for i, c in results]


def next_prompt(
    tok: Tokenizer,
    prefix: TenantPrefix,
    plan: OutputPlan,
    conversation: Sequence[ChatMessage],
    rendered: Sequence[ToolDef],
    last_ids: Sequence[int],
    answer_ids: Sequence[int],
    answer_text: str,
    results: Sequence[tuple[str, str]],
) -> list[int]:
    """``conversation``: the client's messages (earlier rounds' turns are in ``last_ids``; a
    primed answer's opening among them, its closing added here)."""
    tools = tool_messages(results)
    marked = [*conversation, ChatMessage(role="assistant", content=MARKER), *tools]
    rendering = plan.rendering(marked, rendered)
    convo = [*prefix.turns, *rendering.messages]
    extra = {**prefix.template_kwargs, **rendering.template_kwargs}
    full = tok.apply_chat_template(convo, add_generation_prompt=True, marked=True, **extra)
    at = full.rfind(MARKER)
    if at < 0 or full.count(MARKER) != 1:
        text = plan.primer + answer_text + plan.closer
        whole = [*conversation, ChatMessage(role="assistant", content=text), *tools]
        return assemble(tok, prefix, whole, rendering=plan.rendering(whole, rendered))
    ids = list(answer_ids)
    if ids and ids[-1] in tok.eos_token_ids:
        ids.pop()  # the template writes its own end of turn
    suffix = tok.encode_marked(full[at + len(MARKER) :])
    return [*last_ids, *ids, *plan.closer_ids(tok), *suffix]
