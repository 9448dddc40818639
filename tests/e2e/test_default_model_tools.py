"""Tools on the real default model (SmolLM2-135M-Instruct GGUF): its template is recognised as
SmolLM2's (no tool support of its own: the fallback prompt, the ``<tool_call>[...]`` format), a
required call is valid against the function's schema, and ``auto`` leaves an answer in words
exactly as the model writes it without a grammar."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from engine.params import SamplingParams
from engine.serving.engine import Engine
from gateway.chat.messages import ChatMessage
from gateway.chat.prompt import assemble
from gateway.chat.tools.formats import SMOLLM2, detect_format, renders_tools
from gateway.chat.tools.models import ToolDef
from gateway.chat.tools.parser import ToolCallParser
from gateway.chat.tools.plan import plan_output
from gateway.prompts.tenant_prefix import build_prefix

PARAMS = {
    "type": "object",
    "properties": {"order_id": {"type": "integer"}, "urgent": {"type": "boolean"}},
    "required": ["order_id", "urgent"],
    "additionalProperties": False,
}
TOOL = ToolDef.model_validate(
    {
        "type": "function",
        "function": {
            "name": "get_order_status",
            "description": "The delivery status of an order, by its number.",
            "parameters": PARAMS,
        },
    }
)


@pytest.mark.timeout(900)
def test_smollm2_calls_and_answers(default_gguf: Path) -> None:
    engine = Engine.from_pretrained(default_gguf, device="cpu", kv_cache_bytes=64 << 20)
    tok = engine.tokenizer
    assert detect_format(tok.chat_template) is SMOLLM2 and not renders_tools(tok.chat_template)

    def run(question: str, choice: str, grammar: bool = True) -> tuple[str, ToolCallParser]:
        msgs = [ChatMessage(role="user", content=question)]
        plan = plan_output([TOOL], choice, False, None, tok.chat_template)
        rendering = plan.rendering(msgs, [TOOL])
        ids = assemble(tok, build_prefix(tok, None), msgs, rendering=rendering)
        params = SamplingParams(
            max_tokens=48, temperature=0.0, grammar=plan.grammar if grammar else None
        )
        text = tok.decode(list(engine.generate([ids], params)[0].token_ids))
        parser = ToolCallParser(SMOLLM2)
        parser.feed(text)
        parser.close()
        return text, parser

    text, parser = run("Where is my order 4711?", "required")
    assert text.startswith("<tool_call>[") and text.endswith("]</tool_call>"), text
    (call,) = parser.calls
    assert call.name == "get_order_status"
    jsonschema.validate(json.loads(call.arguments), PARAMS)

    question = "What is 2 + 2?"
    constrained, parser = run(question, "auto")
    free, _ = run(question, "auto", grammar=False)
    assert "<tool_call>" not in free  # the model answers in words here
    assert constrained == free and not parser.calls and parser.content == free
