"""A primed call continued (gateway/chat/tools/continuation.py): the next round's prompt is the
last prompt (the block's opening at its end), the model's own tokens, the block's closing the
model never wrote (its schema ended at the JSON), then the tool results: the assistant turn
reads as the family writes a call."""

from __future__ import annotations

import json
from pathlib import Path

from engine.remote.vllm_wire import VLLM_GRAMMARS
from engine.text.tokenizer import Tokenizer
from gateway.chat.messages import ChatMessage
from gateway.chat.prompt import assemble
from gateway.chat.tools.continuation import next_prompt
from gateway.chat.tools.models import ToolDef
from gateway.chat.tools.plan import for_engine, plan_output
from gateway.prompts.tenant_prefix import build_prefix

TOOL = ToolDef.model_validate(
    {"type": "function", "function": {"name": "hours", "parameters": {"type": "object"}}}
)
CALL = json.dumps({"name": "hours", "arguments": {"day": "Monday"}})


def test_the_next_prompt_closes_the_primed_block(demo_model_dir: Path) -> None:
    tok = Tokenizer.from_pretrained(demo_model_dir)
    prefix = build_prefix(tok, "You tell opening hours.")
    plan = for_engine(
        plan_output([TOOL], "required", None, None, tok.chat_template), VLLM_GRAMMARS, "required"
    )
    assert (plan.primer, plan.closer) == ("<tool_call>\n", "\n</tool_call>")
    conversation = [ChatMessage(role="user", content="When are you open on Monday?")]
    rendering = plan.rendering(conversation, [TOOL])
    last = [*assemble(tok, prefix, conversation, rendering=rendering), *plan.primer_ids(tok)]
    answer = [*tok.encode(CALL), *tok.eos_token_ids[:1]]
    ids = next_prompt(
        tok, prefix, plan, conversation, [TOOL], last, answer, CALL, [("call_1", "9 to 5")]
    )
    answered = len(last) + len(answer) - 1  # the answer's end of sequence is the template's
    assert ids[:answered] == [*last, *answer[:-1]]
    closing = tok.encode(plan.closer)
    assert ids[answered : answered + len(closing)] == closing
    text = tok.decode(ids, skip_special_tokens=False)
    assert f"<tool_call>\n{CALL}\n</tool_call>" in text and text.index("9 to 5") > text.index(CALL)
