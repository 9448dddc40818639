"""The HTTP layer under the app: read deadlines, malformed requests, aiohttp's own log lines.

aiohttp parses a request before any middleware sees it, and has no public hook for a header-read
deadline or for its answer to a request it cannot parse (plain text quoting the offending line,
API key included). So every connection has a front of its own, an asyncio protocol between the
socket and aiohttp's (front.py), that reads requests with llhttp (framing.py), enforces the
deadlines, answers what it refuses as OpenAI-shaped errors, and passes aiohttp only requests it
has written itself, which aiohttp's parser accepts. Only aiohttp's public API is used:
``web.AppRunner``, the ``web.Server`` it makes (a protocol factory), an access logger class, the
asyncio protocol and transport interfaces.

    runner.py     make_runner / GatewayRunner (listens itself), run_app (`kvgate serve`)
    front.py      one connection: deadlines, one request at a time into aiohttp, refusals
    framing.py    llhttp -> the requests aiohttp gets; aiohttp's own checks made first
    transport.py  the transport aiohttp writes to
    encoding.py   Content-Encoding middleware (415)
    logs.py       aiohttp's log lines without what they quote
"""

from __future__ import annotations

from gateway.http.encoding import DECODED_ENCODINGS, content_encoding_middleware
from gateway.http.front import ReadDeadlines, body_timeout_error
from gateway.http.logs import AIOHTTP_LOGGERS, AiohttpRedaction, install_log_redaction
from gateway.http.runner import GatewayRunner, make_runner, run_app

__all__ = [
    "AIOHTTP_LOGGERS",
    "DECODED_ENCODINGS",
    "AiohttpRedaction",
    "GatewayRunner",
    "ReadDeadlines",
    "body_timeout_error",
    "content_encoding_middleware",
    "install_log_redaction",
    "make_runner",
    "run_app",
]
