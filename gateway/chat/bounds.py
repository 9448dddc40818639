"""The bounds of one chat request: what a single request may cost the gateway and the engine.

Each bound is a 400 naming the parameter, checked before the request reaches the limiter or the
engine (docs/api.md, "Request bounds", lists them)::

    messages                 at most min(2048, max_model_len) (OpenAI's 2048; every template
                             marks each message with a token); 2048 content parts and 2048
                             tool calls in all
    n                        1..128; widget traffic: 1..the tenant's widget max_choices (default 1)
    n (concurrency)          n choices take n concurrency slots: n above a scope's
                             max_concurrency can never be admitted (400, not a 429 to retry)
    stop                     at most 4 sequences of 1..256 characters each
    logit_bias               at most 300 entries; keys are token ids (decimal, below the vocabulary)
    top_logprobs             0..20
    logprobs, not streamed   n * max_tokens * (top_logprobs + 1) <= 131072 entries
    seed                     a signed 64-bit integer
    metadata                 at most 16 pairs (OpenAI's)

The sizes of the lists and maps are counted before anything is validated (gateway/chat/shape.py).

Why these: every stop string is searched at each step of each choice, over the new text plus
the longest stop's length; the bias is one tensor row per choice; a non-streamed answer holds
all its logprobs until it is written (540-750 bytes per entry at the peak, measured by
``kvgate bench bounds``: the worst allowed request peaks at about 94 MiB of Python memory), a
streamed one only the chunk's.
"""

from __future__ import annotations

from gateway.errors import ApiError

MAX_MESSAGES = 2048  # OpenAI's cap on the messages of one request
MAX_CONTENT_PARTS = 2048  # text parts, in all messages of one request
MAX_TOOL_CALLS = 2048  # assistant tool calls, in all messages of one request
MAX_METADATA = 16  # OpenAI's cap on metadata pairs
MAX_CHOICES = 128
MAX_TOP_LOGPROBS = 20
MAX_STOP_SEQUENCES = 4
MAX_STOP_CHARS = 256
MAX_LOGIT_BIAS = 300
MAX_LOGPROB_ENTRIES = 131_072  # n * max_tokens * (top_logprobs + 1) of a non-streamed answer
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
# A token id has at most this many significant digits (ids are far below 2**31): a longer key
# is refused before int() sees it (int() refuses more than 4300 digits with a ValueError).
MAX_TOKEN_ID_DIGITS = 10


def message_cap(max_model_len: int) -> int:
    """The most messages one request may hold for a model of ``max_model_len`` tokens."""
    return min(MAX_MESSAGES, max_model_len)


def too_many_messages(count: int, cap: int) -> ApiError:
    return ApiError(
        400,
        f"too many messages: {count}; at most {cap} are accepted",
        param="messages",
        code="too_many_messages",
    )


def parse_token_id(key: str) -> int | None:
    """A ``logit_bias`` key as a token id, or None when it is not a plain decimal id."""
    if not key.isascii() or not key.isdigit():
        return None
    digits = key.lstrip("0") or "0"
    if len(digits) > MAX_TOKEN_ID_DIGITS:
        return None
    return int(digits)


def logprob_entries(n: int, max_tokens: int, top_logprobs: int) -> int:
    """Logprob entries a non-streamed answer may hold: each token's and its alternatives'."""
    return n * max_tokens * (top_logprobs + 1)


def check_logprobs_size(n: int, max_tokens: int, top_logprobs: int | None) -> None:
    """A non-streamed answer with logprobs holds them all until it is written: bounded.

    ``top_logprobs`` None: the request did not ask for logprobs (nothing to bound)."""
    if top_logprobs is None:
        return
    entries = logprob_entries(n, max_tokens, top_logprobs)
    if entries <= MAX_LOGPROB_ENTRIES:
        return
    raise ApiError(
        400,
        f"logprobs of a non-streamed answer are limited to {MAX_LOGPROB_ENTRIES} entries: n "
        f"({n}) x max_tokens ({max_tokens}) x (top_logprobs ({top_logprobs}) + 1) = {entries}; "
        "lower n, max_tokens or top_logprobs, or stream the answer",
        param="logprobs",
        code="logprobs_too_large",
    )


def check_choices(n: int, *, widget: bool, max_choices: int) -> None:
    """Widget traffic gets ``n`` up to the tenant's widget ``max_choices`` (default 1): each
    choice is an engine request, and a widget key is public."""
    if widget and n > max_choices:
        raise ApiError(
            400,
            f"n is too large for widget traffic: {n}; this tenant allows at most {max_choices}",
            param="n",
            code="too_many_choices",
        )


def too_wide_error(n: int, scope: str, max_concurrency: int) -> ApiError:
    """``n`` choices need ``n`` concurrency slots at once, more than the scope ever has."""
    return ApiError(
        400,
        f"n is too large: {n} choices run as {n} concurrent requests, and the {scope} limit "
        f"allows at most {max_concurrency} concurrent requests",
        param="n",
        code="too_many_choices",
    )
