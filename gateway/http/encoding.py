"""Content-Encodings of request bodies: gzip and deflate are decoded (by aiohttp, as the body is
read), anything else is refused with 415.

br and zstd are refused before the app runs (framing.py: aiohttp would set a decoder up for them
and fail without their optional packages); the encodings aiohttp passes through undecoded
(``x-gzip``, ``compress``, lists of encodings, unknown names) are refused here, once routed, so the
refusal names its route. A body that does not decode fails as the view reads it, answered 400
``invalid_content_encoding`` by the error middleware (gateway/errors.py).
"""

from __future__ import annotations

from aiohttp import web

from gateway.errors import Handler
from gateway.http.framing import unsupported_encoding

DECODED_ENCODINGS = frozenset({"gzip", "deflate"})
_ACCEPTED_ENCODINGS = DECODED_ENCODINGS | {"", "identity"}


@web.middleware
async def content_encoding_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """415 for a body in a Content-Encoding that is not decoded: the view would read compressed
    bytes."""
    encoding = request.headers.get("Content-Encoding", "").strip()
    known = encoding.isascii() and encoding.lower() in _ACCEPTED_ENCODINGS
    if request.body_exists and not known:
        raise unsupported_encoding()
    return await handler(request)
