"""Prompt assembly: the tenant's system prompt is its own token segment, identical every time.

    prefix ids   = encode(template([tenant system]))                        (no generation prompt)
    marked full  = template([tenant system] + client messages), control tokens as marks
    token ids    = prefix ids ++ encode_marked(marked full[len(marked prefix):])

Tokenizing the two parts separately means a BPE merge can never cross the boundary, so every
request of a tenant starts with exactly ``prefix.ids`` whatever the conversation is: the pinned
blocks always match. The template must render the prefix as a prefix of the full text (ChatML and
the Llama/Qwen templates do); a template that does not is rejected loudly, never silently.

Control tokens: in the conversation only the template's own structure yields them; text in client
messages is encoded as plain text, so ``<|im_end|>\n<|im_start|>system`` written by a client is
a few ordinary tokens, never a turn of its own (engine/text/chat_encoding.py). The
tenant's system prompt is the operator's, encoded as it always was (control-token strings in it are
control tokens): the pinned prefix stays token-identical.

Bounds checked before any rendering or tokenizing (``check_bounds``): at most
``min(MAX_MESSAGES, max_model_len)`` messages, and no more characters than ``max_model_len``
tokens can cover (engine/text/text_bound.py: a bound that never refuses a prompt that
fits, for templates that copy message text).

The prefix itself (``TenantPrefix``, ``build_prefix``) is gateway/prompts/tenant_prefix.py's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from engine.text.chat_encoding import ForgedMark, TokenLimitExceeded
from engine.text.chat_template import TemplateError
from engine.text.text_bound import TextBound
from gateway.chat.bounds import message_cap, too_many_messages
from gateway.chat.messages import ChatMessage
from gateway.chat.tools.render import Rendering, plain_messages
from gateway.errors import ApiError
from gateway.prompts.tenant_prefix import ChatTokenizer, TemplateMismatch, TenantPrefix


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


def check_bounds(
    messages: Sequence[ChatMessage],
    max_model_len: int,
    bound: TextBound | None,
    *,
    extra: Sequence[str] = (),
) -> int:
    """Refuse what can never fit, before any work: too many messages, or more characters than
    ``max_model_len`` tokens can cover (``extra``: other text the prompt holds, the tools).
    Returns the characters counted (the work estimate)."""
    cap = message_cap(max_model_len)
    if len(messages) > cap:
        raise too_many_messages(len(messages), cap)
    texts = [m.text for m in messages] + list(extra)
    texts += [t for m in messages if m.tool_calls for t in m.texts[1:]]
    chars = sum(map(len, texts))
    if bound is None or chars <= max_model_len:  # a token is at least one character
        return chars
    counted = sum(map(bound.count, texts))
    if counted > max_model_len * bound.chars_per_token:
        raise ApiError(
            400,
            f"this model's maximum context length is {max_model_len} tokens; the messages have "
            f"{counted} characters, more than {max_model_len} tokens can hold (one token of "
            f"this model covers at most {bound.chars_per_token} characters)",
            param="messages",
            code="context_length_exceeded",
        )
    return chars


def context_length_error(max_model_len: int, n_prompt: int) -> ApiError:
    return ApiError(
        400,
        f"this model's maximum context length is {max_model_len} tokens; the messages "
        f"resulted in {n_prompt} tokens",
        param="messages",
        code="context_length_exceeded",
    )


def assemble(
    tokenizer: ChatTokenizer,
    prefix: TenantPrefix,
    messages: Sequence[ChatMessage],
    max_model_len: int | None = None,
    *,
    rendering: Rendering | None = None,
) -> list[int]:
    """Token ids of the whole prompt: ``prefix.ids`` followed by the conversation's ids.

    ``rendering``: the conversation with tools (gateway/chat/tools/render.py); without it, the
    plain messages. With ``max_model_len``, a prompt that leaves no room for one output token is
    refused (context_length_exceeded) as soon as its token count is known, before its ids are
    listed.

    A template that renders tools inside the system turn (Qwen2.5, Llama 3.1) cannot keep the
    tenant's rendered prompt as a prefix of a request with tools: then the whole prompt is
    encoded as the conversation is (control tokens from the template only; control-token
    strings in the tenant prompt stay text here), and the ids it shares with ``prefix.ids``
    still match the tenant's pinned blocks (``shared_prefix``)."""
    rendering = rendering or Rendering(plain_messages(messages))
    convo = [*prefix.turns, *rendering.messages]
    extra = {**prefix.template_kwargs, **rendering.template_kwargs}
    try:
        if extra or any("tool_calls" in m for m in convo):
            # Text the marked rendering does not check (tools, calls): no forged marks in it.
            tokenizer.control_marks.check_text(json.dumps([convo, extra], ensure_ascii=False))
        full = tokenizer.apply_chat_template(
            convo, add_generation_prompt=True, marked=True, **extra
        )
    except ForgedMark as exc:
        raise ApiError(400, str(exc), param="messages") from None
    except TemplateError as exc:  # the template's raise_exception: roles, order, calls
        raise ApiError(
            400, f"the model's chat template refused this conversation: {exc}", param="messages"
        ) from None
    if full.startswith(prefix.rendered):
        head, rest = list(prefix.ids), full[len(prefix.rendered) :]
    elif extra:
        head, rest = [], full
    else:
        raise TemplateMismatch("chat template does not render the system prompt as a prefix")
    limit = None if max_model_len is None else max_model_len - 1 - len(head)
    try:
        tail = tokenizer.encode_marked(rest, limit)
    except TokenLimitExceeded as exc:
        assert max_model_len is not None
        raise context_length_error(max_model_len, len(head) + exc.count) from None
    return [*head, *tail]


def shared_prefix(ids: Sequence[int], prefix: TenantPrefix) -> int:
    """How many leading ``ids`` are the tenant prefix's own (all of it, unless tools moved into
    the system turn): the part of the prompt every end user of the tenant shares."""
    n = 0
    for a, b in zip(ids, prefix.ids, strict=False):
        if a != b:
            break
        n += 1
    return n
