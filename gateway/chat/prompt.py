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
a few ordinary tokens, never a turn of its own (engine/model/chat_encoding.py). The tenant's system
prompt is the operator's, encoded as it always was (control-token strings in it are control
tokens): the pinned prefix stays token-identical.

Bounds checked before any rendering or tokenizing (``check_bounds``): at most
``min(MAX_MESSAGES, max_model_len)`` messages, and no more characters than ``max_model_len``
tokens can cover (engine/model/text_bound.py: a bound that never refuses a prompt that fits, for
templates that copy message text).

The prefix itself (``TenantPrefix``, ``build_prefix``) is gateway/tenant_prefix.py's.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.model.chat_encoding import ForgedMark, TokenLimitExceeded
from engine.model.text_bound import TextBound
from gateway.chat.schemas import ChatMessage
from gateway.errors import ApiError
from gateway.tenant_prefix import ChatTokenizer, TemplateMismatch, TenantPrefix

MAX_MESSAGES = 2048  # OpenAI's cap on the messages of one request


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


def check_bounds(
    messages: Sequence[ChatMessage], max_model_len: int, bound: TextBound | None
) -> int:
    """Refuse what can never fit, before any work: too many messages, or more characters than
    ``max_model_len`` tokens can cover. Returns the characters counted (the work estimate)."""
    cap = min(MAX_MESSAGES, max_model_len)  # every template marks each message with a token
    if len(messages) > cap:
        raise ApiError(
            400,
            f"too many messages: {len(messages)}; at most {cap} are accepted",
            param="messages",
            code="too_many_messages",
        )
    texts = [m.text for m in messages]
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
) -> list[int]:
    """Token ids of the whole prompt: ``prefix.ids`` followed by the conversation's ids.

    With ``max_model_len``, a prompt that leaves no room for one output token is refused
    (context_length_exceeded) as soon as its token count is known, before its ids are listed."""
    convo = to_template_messages(messages)
    if prefix.system_prompt is not None:
        convo = [{"role": "system", "content": prefix.system_prompt}, *convo]
    try:
        full = tokenizer.apply_chat_template(convo, add_generation_prompt=True, marked=True)
    except ForgedMark as exc:
        raise ApiError(400, str(exc), param="messages") from None
    if not full.startswith(prefix.rendered):
        raise TemplateMismatch("chat template does not render the system prompt as a prefix")
    limit = None if max_model_len is None else max_model_len - 1 - len(prefix.ids)
    try:
        tail = tokenizer.encode_marked(full[len(prefix.rendered) :], limit)
    except TokenLimitExceeded as exc:
        assert max_model_len is not None
        raise context_length_error(max_model_len, len(prefix.ids) + exc.count) from None
    return [*prefix.ids, *tail]
