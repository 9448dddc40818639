"""The worker protocol: every message type, declared once, and its one codec (msgspec).

Between a gateway and a worker (engine/serving/worker/transport.py, engine/remote/channel.py)
every message is one msgpack-encoded ``Struct``, tagged by ``op``; the engine's own types
(``SamplingParams``, ``GenerateOptions``, ``PinHandle``, ``CacheStats``, ``RequestMetrics``,
``TokenLogprob``) travel as they are declared, so a field added to one of them travels without a
protocol change. Decoding validates every field against its type (and runs the engine types'
``__post_init__`` checks); a message that does not decode is refused, never half-applied::

    gateway -> worker   Generate | Cancel | Abort | Pin | Unpin | Forget | Load | Subscribe
    worker -> gateway   Output (frames of a generate stream) | Failed | Done | Pinned | Forgot
                        | Loaded | Events | EventsEnd        (each names the ``call`` it answers)

The probes (``/healthz``, ``/v1/info``, ``/v1/tokenizer``) stay plain HTTP with JSON bodies of
``WorkerInfo`` and ``TokenizerPayload`` (encoder and decoder both here). ``PROTOCOL`` is a digest
of every message schema: ``/v1/info`` announces it, and a gateway takes in only workers that
speak its own (a newer field that an older worker would ignore is a mismatch, not a surprise).

Errors travel by class name (``ErrorInfo``) and are rebuilt on the caller's side as the same
engine error, so the gateway's error mapping does not know whether the engine is local or remote.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from engine import errors as engine_errors
from engine.api import GenerateOptions
from engine.core.kv import CacheStats, PinHandle
from engine.core.kv.types import Tier as Tier  # named by the KV events (Tiered)
from engine.outputs import FinishReason, RequestMetrics, TokenLogprob
from engine.params import SamplingParams

if TYPE_CHECKING:
    from engine.text.tokenizer import Tokenizer

_T = TypeVar("_T")

READY_PREFIX = "kvgate worker: listening on "  # the stdout line of a worker that serves (+ URL)
CALLS_PATH = "/v1/calls"  # the worker's WebSocket of calls
HEARTBEAT_S = 5.0  # a ping each interval; no pong within half of it closes the connection
MAX_MESSAGE_BYTES = 64 << 20  # a prompt's token ids (a pin of a long prompt) fit many times


class WireError(Exception):
    """A payload that does not follow the protocol (a bug, a version mismatch, or an attack)."""


# -- probes (HTTP, JSON) ---------------------------------------------------------------------
class WorkerInfo(msgspec.Struct, frozen=True):
    worker_id: str
    boot_id: str  # new each start: a restarted worker has lost its pins
    block_size: int
    max_model_len: int
    blocks_total: int
    pin_budget_blocks: int
    protocol: str = ""  # PROTOCOL of the worker's code ("": a worker from before the transport)


class TokenizerPayload(msgspec.Struct, frozen=True):
    """What a gateway needs to rebuild the tokenizer (engine/text/tokenizer.py) without the
    model files: the HF tokenizers JSON, chat template, special tokens and EOS ids."""

    backend: str
    chat_template: str | None
    special_tokens: dict[str, str | None]
    add_bos: bool
    eos_token_ids: list[int]

    @classmethod
    def of(cls, tok: Tokenizer) -> TokenizerPayload:
        return cls(
            tok.backend.to_str(),
            tok.chat_template,
            dict(tok.special_tokens),
            bool(tok.add_bos),
            [int(t) for t in tok.eos_token_ids],
        )

    def build(self) -> Tokenizer:
        from tokenizers import Tokenizer as Backend

        from engine.text.tokenizer import Tokenizer

        config: dict[str, Any] = {"add_bos_token": self.add_bos}
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template
        config.update({k: v for k, v in self.special_tokens.items() if v is not None})
        return Tokenizer(Backend.from_str(self.backend), config, list(self.eos_token_ids))


# -- KV events (engine/serving/worker/events.py) ---------------------------------------------
# Arrays on the wire: ["s", namespace digest, key, parent | null], ["r", key], ["t", key, tier]
STORED, REMOVED, TIER = "s", "r", "t"


class Stored(msgspec.Struct, frozen=True, array_like=True, tag=STORED):
    namespace: str  # root key digest of the namespace (hex), never the salt itself
    key: str  # block key (hex)
    parent: str | None


class Removed(msgspec.Struct, frozen=True, array_like=True, tag=REMOVED):
    key: str


class Tiered(msgspec.Struct, frozen=True, array_like=True, tag=TIER):
    key: str
    tier: Tier | None  # copied out to host memory, restored to the device, or dropped (None)


KvEvent = Stored | Removed | Tiered


def kv_events(arrays: list[list[Any]]) -> list[KvEvent]:
    """Events from their array form (as they travel): ``[["s", ns, key, None], ...]``."""
    return msgspec.convert(arrays, list[KvEvent])


class WorkerLoad(msgspec.Struct, frozen=True):
    healthy: bool
    boot_id: str
    running: int
    waiting: int
    outstanding_tokens: int
    served: int
    stats: CacheStats


# -- errors -----------------------------------------------------------------------------------
_ERRORS: dict[str, type[Exception]] = {
    cls.__name__: cls
    for cls in (
        engine_errors.EngineError,
        engine_errors.EngineOverloaded,
        engine_errors.TenantQueueFull,
        engine_errors.PromptTooLong,
        engine_errors.PinRejected,
        engine_errors.RequestAborted,
        engine_errors.EngineDead,
        engine_errors.EngineClosed,
        engine_errors.DuplicateRequestId,
        engine_errors.GrammarRejected,
        ValueError,
    )
}


class ErrorInfo(msgspec.Struct, frozen=True, omit_defaults=True):
    type: str
    message: str
    param: str | None = None
    reason: str | None = None

    @classmethod
    def of(cls, exc: BaseException) -> ErrorInfo:
        param, reason = getattr(exc, "param", None), getattr(exc, "reason", None)
        return cls(type(exc).__name__, str(exc), param, reason)

    def rebuild(self) -> Exception:
        """The same engine error class (anything unknown: EngineError)."""
        cls = _ERRORS.get(self.type, engine_errors.EngineError)
        if cls is engine_errors.PromptTooLong:
            return engine_errors.PromptTooLong(self.message, param=self.param)
        if cls is engine_errors.GrammarRejected:
            return engine_errors.GrammarRejected(self.message, param=self.param)
        if cls is engine_errors.PinRejected:
            return engine_errors.PinRejected(self.message, reason=self.reason)
        return cls(self.message)


# -- gateway -> worker ------------------------------------------------------------------------
class _Call(msgspec.Struct, frozen=True, tag_field="op", forbid_unknown_fields=True):
    call: int  # chosen by the gateway, unique among its calls in flight on this worker


class Generate(_Call, frozen=True, tag="generate"):
    token_ids: list[int]
    params: SamplingParams
    options: GenerateOptions  # options.request_id is always set by the gateway


class Cancel(_Call, frozen=True, tag="cancel"):
    """The caller left the call (a stream, a pin, a subscription): abort it, free its blocks."""


class Abort(_Call, frozen=True, tag="abort"):
    request_id: str


class Pin(_Call, frozen=True, tag="pin"):
    namespace: str
    token_ids: list[int]


class Unpin(_Call, frozen=True, tag="unpin"):
    handle: PinHandle


class Forget(_Call, frozen=True, tag="forget"):
    namespace: str


class Load(_Call, frozen=True, tag="load"):
    pass


class Subscribe(_Call, frozen=True, tag="subscribe"):
    pass


Request = Generate | Cancel | Abort | Pin | Unpin | Forget | Load | Subscribe


# -- worker -> gateway ------------------------------------------------------------------------
class Output(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, tag="o"):
    """One frame of a generate stream: the tokens since the previous frame. The first and the
    final frame carry the cached-token count and the timings; the final one its finish reason
    and every generated token (a check on the sum of the deltas)."""

    call: int
    new_token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None  # one per new token, when asked
    cached: int | None = None
    metrics: RequestMetrics | None = None
    finished: bool = False
    finish_reason: FinishReason | None = None
    token_ids: list[int] | None = None
    error: ErrorInfo | None = None  # the engine gave up on the request (finish "abort")


class _Reply(msgspec.Struct, frozen=True, array_like=True):
    call: int


class Failed(_Reply, frozen=True, tag="failed"):
    """The call was refused (bad request, admission) or broke (the engine stopped)."""

    error: ErrorInfo


class Done(_Reply, frozen=True, tag="done"):
    pass


class Pinned(_Reply, frozen=True, tag="pinned"):
    handle: PinHandle


class Forgot(_Reply, frozen=True, tag="forgot"):
    removed: bool


class Loaded(_Reply, frozen=True, tag="loaded"):
    load: WorkerLoad


class Events(_Reply, frozen=True, tag="events"):
    events: list[KvEvent]  # the first batch of a subscription is empty: subscribed from here


class EventsEnd(_Reply, frozen=True, tag="events_end"):
    """The subscriber fell too far behind and was cut off (it subscribes again)."""


Reply = Output | Failed | Done | Pinned | Forgot | Loaded | Events | EventsEnd


# -- the codec --------------------------------------------------------------------------------
_encoder = msgspec.msgpack.Encoder()
_requests: msgspec.msgpack.Decoder[Request] = msgspec.msgpack.Decoder(Request)
_replies: msgspec.msgpack.Decoder[Reply] = msgspec.msgpack.Decoder(Reply)
_json = msgspec.json.Encoder()


def encode(msg: Request | Reply) -> bytes:
    return _encoder.encode(msg)


def decode_request(data: bytes) -> Request:
    try:
        return _requests.decode(data)
    except msgspec.DecodeError as exc:  # ValidationError included
        op = _peek(data).get("op")
        name = f"bad {op} request" if isinstance(op, str) and op.isidentifier() else "bad request"
        raise WireError(f"{name}: {exc}") from None


def decode_reply(data: bytes) -> Reply:
    try:
        return _replies.decode(data)
    except msgspec.DecodeError as exc:
        raise WireError(f"bad reply: {exc}") from None


def _peek(data: bytes) -> dict[Any, Any]:
    """A message that did not decode, as a plain map (empty if it is not one)."""
    try:
        raw = msgspec.msgpack.decode(data)
    except msgspec.DecodeError:
        return {}
    return raw if isinstance(raw, dict) else {}


def call_of(data: bytes) -> int | None:
    """The call id of a message that did not decode, if it names one (to refuse that call)."""
    call = _peek(data).get("call")
    return call if isinstance(call, int) and not isinstance(call, bool) else None


def to_json(obj: WorkerInfo | TokenizerPayload) -> bytes:
    return _json.encode(obj)


def from_json(data: bytes, cls: type[_T]) -> _T:
    try:
        decoded: _T = msgspec.json.decode(data, type=cls)
        return decoded
    except msgspec.DecodeError as exc:
        raise WireError(f"bad {cls.__name__}: {exc}") from None


def _protocol_digest() -> str:
    schemas, components = msgspec.json.schema_components((Request, Reply))
    text = msgspec.json.encode([schemas, components], order="sorted")
    return hashlib.blake2b(text, digest_size=8).hexdigest()


PROTOCOL = _protocol_digest()
