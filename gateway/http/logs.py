"""aiohttp's own log lines, redacted: they quote requests (the request line, User-Agent and
Referer in access lines, header lines in parse errors, exception messages)."""

from __future__ import annotations

import logging

from gateway.errors import stack_summary

AIOHTTP_LOGGERS = ("aiohttp.access", "aiohttp.server", "aiohttp.web", "aiohttp.internal")
_QUOTING_EXTRAS = ("first_request_line", "request_header", "response_header")


class AiohttpRedaction(logging.Filter):
    """Keeps an aiohttp record's template, drops its arguments, header extras and exception
    message (the type and stack frames stay). Access lines keep only the status."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "aiohttp.access":
            record.msg = f"http_access status={record.__dict__.get('response_status', '-')}"
        elif record.exc_info and record.exc_info[1] is not None:
            record.msg = f"{record.msg} [{stack_summary(record.exc_info[1])}]"
        record.args = None
        record.exc_info = record.exc_text = None
        for name in _QUOTING_EXTRAS:
            record.__dict__.pop(name, None)
        return True


_REDACTION = AiohttpRedaction()


def install_log_redaction() -> None:
    """Idempotent; process-wide (aiohttp's loggers are module globals)."""
    for name in AIOHTTP_LOGGERS:
        logger = logging.getLogger(name)
        if _REDACTION not in logger.filters:
            logger.addFilter(_REDACTION)
