"""Prompt assembly: the tenant's system prompt is its own token segment, identical every time.

    rendered prefix  = template([tenant system])                   (no generation prompt)
    rendered full    = template([tenant system] + client messages)  (with generation prompt)
    token ids        = encode(rendered prefix) ++ encode(rendered full[len(rendered prefix):])

Tokenizing the two texts separately means a BPE merge can never cross the boundary, so every
request of a tenant starts with exactly ``prefix.ids`` whatever the conversation is: the pinned
blocks always match. The template must render the prefix as a prefix of the full text (ChatML and
the Llama/Qwen templates do); a template that does not is rejected loudly, never silently.
The prefix itself (``TenantPrefix``, ``build_prefix``) is gateway/tenant_prefix.py's.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.chat.schemas import ChatMessage
from gateway.errors import ApiError
from gateway.tenant_prefix import ChatTokenizer, TemplateMismatch, TenantPrefix


def to_template_messages(messages: Sequence[ChatMessage]) -> list[dict[str, str]]:
    # "developer" is OpenAI's newer name for a system message.
    return [{"role": "system" if m.is_system else m.role, "content": m.text} for m in messages]


def check_client_system(
    messages: Sequence[ChatMessage], allow_client_system: bool, *, widget: bool = False
) -> None:
    """``widget``: browser traffic, which needs the tenant's widget opt-in as well."""
    if allow_client_system:
        return
    source = "from the widget" if widget else "from clients"
    for i, m in enumerate(messages):
        if m.is_system:
            raise ApiError(
                400,
                f"this tenant does not accept system or developer messages {source}",
                param=f"messages[{i}].role",
                code="system_message_not_allowed",
            )


def assemble(
    tokenizer: ChatTokenizer, prefix: TenantPrefix, messages: Sequence[ChatMessage]
) -> list[int]:
    """Token ids of the whole prompt: ``prefix.ids`` followed by the conversation's ids."""
    convo = to_template_messages(messages)
    if prefix.system_prompt is not None:
        convo = [{"role": "system", "content": prefix.system_prompt}, *convo]
    full = tokenizer.apply_chat_template(convo, add_generation_prompt=True)
    if not full.startswith(prefix.rendered):
        raise TemplateMismatch("chat template does not render the system prompt as a prefix")
    return [*prefix.ids, *tokenizer.encode(full[len(prefix.rendered) :])]
