"""structlog configuration: one JSON object per line on stdout (or console lines).

Request log lines carry ids, tenant, status and token counts only: never prompt text, completion
text or keys (the chat view logs nothing else). Some values still come from clients (the
``user`` field as ``end_user``, a session's end user id), so every value is escaped before it
is rendered, in both formats: control characters (newline, carriage return, the ESC of ANSI
sequences, C1 controls), Unicode line / paragraph separators and bidirectional overrides become
``\\n``, ``\\x1b``, ``\\u2028``... A client cannot start a log line of its own, recolour the
console or make a line read differently from what it holds, neither on the console nor in a log
viewer that shows decoded JSON values. (The console format then quotes values that hold spaces
or quotes, as Python's repr, so their escapes show doubled there.) Tracebacks (``exception``,
``stack``: the gateway's own) keep their line breaks, every line after the first indented.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

from gateway.settings import TelemetrySettings

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
MULTILINE_FIELDS = frozenset({"exception", "stack"})
CONTINUATION = "\n  "  # how a multi-line field's later lines start: never at column 0


def _escape_one(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """``text`` with every control / separator / bidi character written as an escape."""
    return _UNSAFE.sub(_escape_one, text)


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return escape_controls(value)
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_clean(v) for v in value)
    return value


def escape_control_chars(
    logger: Any, method_name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: every value escaped (``escape_controls``), keys too."""
    out: dict[str, Any] = {}
    for key, value in event_dict.items():
        if key in MULTILINE_FIELDS and isinstance(value, str):
            out[key] = CONTINUATION.join(escape_controls(line) for line in value.split("\n"))
        else:
            out[_clean(key)] = _clean(value)
    return out


class EscapingFormatter(logging.Formatter):
    """stdlib records (libraries' loggers) get the same escaping of their message."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape_controls(super().formatMessage(record))


def configure_logging(settings: TelemetrySettings) -> None:
    """Process-wide: called by ``kvgate serve`` (never at import, never by ``create_app``)."""
    level = getattr(logging, settings.log_level.upper())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if settings.log_json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            escape_control_chars,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stdout),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(EscapingFormatter("%(message)s"))
    logging.basicConfig(level=level, handlers=[handler])
