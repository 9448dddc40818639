"""Domain errors of the engine (plain Python). The gateway maps them to HTTP by class.

``param`` names the request field at fault where there is one (OpenAI error bodies carry it).
"""

from __future__ import annotations


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""

    param: str | None = None


class EngineOverloaded(EngineError):
    """The bounded waiting queue is full; the caller should retry later (HTTP 503/429)."""


class TenantQueueFull(EngineOverloaded):
    """The engine's waiting queue is full and this tenant holds its share of it already: only
    this tenant is refused (HTTP 429 with Retry-After); the others keep their shares."""


class PromptTooLong(EngineError, ValueError):
    """The request can never run: prompt (+ max_tokens) beyond max_model_len or the KV pool."""

    def __init__(self, message: str, *, param: str | None = "messages") -> None:
        super().__init__(message)
        self.param = param


class PinRejected(EngineError):
    """A prefix could not be pinned (cap on pinned blocks reached, reuse disabled, ...)."""

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class RequestAborted(EngineError):
    """The engine shut down while the request was in flight (its stream ends with this)."""


class EngineDead(EngineError):
    """The engine loop stopped after an unexpected error; no further requests are accepted."""


class EngineClosed(EngineError):
    """The engine was shut down; no further requests are accepted."""


class GrammarRejected(EngineError, ValueError):
    """A request's grammar cannot be compiled or enforced (the message names what)."""

    def __init__(self, message: str, *, param: str | None = "response_format") -> None:
        super().__init__(message)
        self.param = param


class DuplicateRequestId(EngineError, ValueError):
    """A request with this id is already in flight."""

    param = "request_id"


class RequestRejected(EngineError, ValueError):
    """An engine the gateway does not run (a vLLM server) refused the request as invalid (HTTP
    400 from it): the message is the server's."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param
