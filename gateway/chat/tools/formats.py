"""Tool-call output formats, one per model family, recognised from the chat template.

Each family writes its calls its own way (what it was trained on), so the grammar that forces a
call, the parser that reads one and the fallback prompt that teaches one follow the family::

    hermes    <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>   one block per call
              (Hermes 2/3, Qwen2.5 / Qwen3; the template mentions <tool_call>)
    llama3    {"name": "f", "parameters": {...}}; {...}               the whole answer is the calls
              (Llama 3.1 / 3.2 JSON tool calling; the template has <|eot_id|> or <|python_tag|>)
    smollm2   <tool_call>[{"name": "f", "arguments": {...}}, ...]</tool_call>   one JSON array
              (SmolLM2 Instruct; the template names SmolLM)

A template that matches none (the demo model's plain ChatML, say) gets ``hermes``: the most
widely trained open format. Detection reads only the template source, which every gateway has
(a gateway in front of workers rebuilds the tokenizer from the worker's payload: no GGUF
metadata), so every gateway of a cluster picks the same format.

``fallback`` is the system text for templates without tool support (they do not read ``tools``):
the family's own instructions (SmolLM2's from its model card, Qwen2.5's for ``hermes``,
Llama 3.1's for ``llama3``) with the tools as JSON lines; ``{tools}`` is replaced.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from engine.text.chat_template import template_variables


@dataclass(frozen=True)
class ToolFormat:
    name: str
    open: str | None  # text that starts a call block; None: a call is the answer's first "{"
    close: str | None  # text that ends a call block
    array: bool  # the block holds one JSON array of calls (else one call object)
    args_key: str  # the key of the arguments in a call object
    separator: str  # between two calls: blocks (hermes) or objects (llama3)
    pad: str  # between a block's tags and its JSON (hermes: a newline on each side)
    fallback: str  # system text for templates without tool support
    tool_role: str  # the role a tool result takes in the fallback rendering
    # The answer starts inside a call block: its opening (``primer``) ends the prompt, and the
    # model writes the block's JSON, held to it by a JSON schema (gateway/chat/tools/plan.py).
    primed: bool = False

    @property
    def primer(self) -> str:
        """The text that opens a call block, up to its JSON."""
        return self.open + self.pad if self.open is not None else ""

    @property
    def closer(self) -> str:
        """The text after a block's JSON that closes it."""
        return self.pad + self.close if self.close is not None else ""


_HERMES_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""

_SMOLLM2_PROMPT = """You are an expert in composing functions. You are given a question and a \
set of possible functions. Based on the question, you will need to make one or more \
function/tool calls to achieve the purpose. If none of the functions can be used, point it out \
and refuse to answer. If the given question lacks the parameters required by the function, also \
point it out.

You have access to the following tools:
<tools>{tools}</tools>

The output MUST strictly adhere to the following format, and NO other text MUST be included.
The example format is as follows. Please make sure the parameter type is correct. If no \
function call is needed, please make the tool calls an empty list '[]'.
<tool_call>[
{{"name": "func_name1", "arguments": {{"argument1": "value1", "argument2": "value2"}}}},
... (more tool calls as required)
]</tool_call>"""

_LLAMA3_PROMPT = """You have access to the following functions. To call a function, please \
respond with JSON for a function call. Respond in the format {{"name": function name, \
"parameters": dictionary of argument name and its value}}. Do not use variables.

{tools}"""

HERMES = ToolFormat(
    "hermes", "<tool_call>", "</tool_call>", False, "arguments", "\n", "\n", _HERMES_PROMPT, "user"
)
SMOLLM2 = ToolFormat(
    "smollm2", "<tool_call>", "</tool_call>", True, "arguments", "", "", _SMOLLM2_PROMPT, "user"
)
LLAMA3 = ToolFormat("llama3", None, None, False, "parameters", "; ", "", _LLAMA3_PROMPT, "ipython")
FORMATS = {f.name: f for f in (HERMES, SMOLLM2, LLAMA3)}


@lru_cache(maxsize=16)
def detect_format(template: str | None) -> ToolFormat:
    """The family's format from its chat template (first match): ``<tool_call>`` -> hermes
    (the template names the Hermes tags itself), ``SmolLM`` -> smollm2, a Llama 3 header
    token -> llama3; otherwise hermes."""
    source = template or ""
    if "<tool_call>" in source:
        return HERMES
    if "SmolLM" in source:
        return SMOLLM2
    if "<|python_tag|>" in source or "<|eot_id|>" in source:
        return LLAMA3
    return HERMES


@lru_cache(maxsize=16)
def renders_tools(template: str | None) -> bool:
    """Whether the template renders tool definitions itself (it reads ``tools``)."""
    return bool(template) and "tools" in template_variables(template or "")
