"""structlog configuration: one JSON object per line on stdout.

Request log lines carry ids, tenant, status and token counts only: never prompt text, completion
text or keys (the chat view logs nothing else).
"""

from __future__ import annotations

import logging
import sys

import structlog

from gateway.settings import TelemetrySettings


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
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stdout),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=level, stream=sys.stdout, format="%(message)s")
