"""What a request's tools and ``response_format`` mean for its prompt, grammar and answer.

    tool_choice          grammar (gateway/chat/tools/grammar.py)   answer parsed for calls
    (no tools)           response_format's, if any                 no
    "none"               response_format's, if any                 no (tools still rendered)
    "auto" (default)     lazy: forced from the opening tag on      yes
    "required"           one call or more (one: no parallel)       yes
    {"function": f}      exactly one call of f                     yes

An engine that enforces JSON schemas but not the Lark dialect (vLLM: ``for_engine``) serves a
forced call ("required", a named function) primed: the call block's opening (``<tool_call>``)
ends the prompt and a JSON schema holds the model to the block's JSON, so it writes exactly a
call; one call a step (for SmolLM2's array blocks, as many as ``parallel_tool_calls`` allows).
"auto" is generated freely and still parsed for calls.

Tools are rendered whatever the choice, so a client's fixed tools give the same prompt tokens
with every choice (its cached prefix). The format is the model family's
(gateway/chat/tools/formats.py), read from the chat template.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from engine.constraints import Grammar
from engine.text.tokenizer import Tokenizer
from gateway.chat.messages import ChatMessage
from gateway.chat.tools.formats import ToolFormat, detect_format, renders_tools
from gateway.chat.tools.grammar import forced_call_schema, response_format_grammar, tool_grammar
from gateway.chat.tools.models import NamedToolChoice, ResponseFormat, ToolChoice, ToolDef
from gateway.chat.tools.render import Rendering, render
from gateway.errors import ApiError


@dataclass(frozen=True)
class OutputPlan:
    fmt: ToolFormat  # the family's call format (rendering, grammar and parsing agree on it)
    native: bool  # the template renders tools itself
    grammar: Grammar | None
    grammar_param: str  # the request field a refused grammar is about
    calls: ToolFormat | None  # parse the answer for calls in this format (None: plain text)
    # The functions the grammar allows, with their index in ``tools`` (to name a refused one).
    tools: tuple[tuple[int, ToolDef], ...]

    @property
    def primer(self) -> str:
        """The text the answer starts with, written as the prompt's end (a primed call block)."""
        return self.calls.primer if self.calls is not None and self.calls.primed else ""

    @property
    def closer(self) -> str:
        """The text that closes a primed answer's call block (the model stops at its JSON's
        end): added where the answer is continued (tool rounds, stored tails)."""
        return self.calls.closer if self.calls is not None and self.calls.primed else ""

    def primer_ids(self, tok: Tokenizer) -> list[int]:
        """``primer``'s tokens, as the model writes that text (none when not primed)."""
        return tok.encode(self.primer) if self.primer else []

    def opened(self, ids: list[int], tok: Tokenizer) -> list[int]:
        """A prompt's ids with the primer after them: where the answer starts (``ids`` itself
        when not primed)."""
        return [*ids, *self.primer_ids(tok)] if self.primer else ids

    def closer_ids(self, tok: Tokenizer) -> list[int]:
        """``closer``'s tokens (none when not primed)."""
        return tok.encode(self.closer) if self.closer else []

    def rendering(self, messages: Sequence[ChatMessage], tools: Sequence[ToolDef]) -> Rendering:
        """The conversation for the template (with the prompt's rendering, off the loop for a
        large one: a conversation may hold thousands of messages)."""
        return render(messages, tools, self.fmt, self.native)


def plan_output(
    tools: Sequence[ToolDef],
    choice: ToolChoice | None,
    parallel: bool | None,
    response_format: ResponseFormat | None,
    template: str | None,
) -> OutputPlan:
    fmt, native = detect_format(template), renders_tools(template)
    if not tools or choice == "none":
        grammar = response_format_grammar(response_format)
        return OutputPlan(fmt, native, grammar, "response_format", None, ())
    if isinstance(choice, NamedToolChoice):
        named = choice.function.name
        allowed = tuple((i, t) for i, t in enumerate(tools) if t.function.name == named)
        mode = "named"
    else:
        allowed, mode = tuple(enumerate(tools)), choice or "auto"
    grammar = tool_grammar([t for _, t in allowed], fmt, mode, parallel is not False)
    return OutputPlan(fmt, native, grammar, "tools", fmt, allowed)


def for_engine(
    plan: OutputPlan,
    kinds: frozenset[str],
    choice: ToolChoice | None,
    parallel: bool | None = None,
) -> OutputPlan:
    """The plan as an engine that enforces only grammars of ``kinds`` can serve it (vLLM: no
    Lark, so no tool-call grammar): with ``tool_choice`` "auto" the answer is generated freely
    and still parsed for calls; a forced call ("required", a named function) is primed and held
    by a JSON schema where the engine enforces those, else refused, naming ``tool_choice``."""
    grammar = plan.grammar
    if grammar is None or grammar.kind in kinds:
        return plan
    if plan.grammar_param == "tools" and choice in (None, "auto"):
        return replace(plan, grammar=None)
    if plan.grammar_param == "tools" and "json_schema" in kinds:
        many = choice == "required" and parallel is not False
        forced = forced_call_schema([t for _, t in plan.tools], plan.fmt, many)
        calls = replace(plan.fmt, primed=plan.fmt.open is not None)
        return replace(plan, grammar=forced, calls=calls)
    param = "tool_choice" if plan.grammar_param == "tools" else plan.grammar_param
    raise ApiError(
        400,
        f"{param}: this gateway's engine cannot enforce it (a {grammar.kind} grammar); "
        'use tool_choice "auto" or "none"',
        param=param,
        code="unsupported_parameter",
    )
