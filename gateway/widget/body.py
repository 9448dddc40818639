"""Request bodies of the widget routes."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from gateway.errors import ApiError


async def read_json(request: web.Request) -> Any:
    """The JSON body; anything that is not JSON text is a 400."""
    try:
        return json.loads(await request.read())
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError included
        raise ApiError(400, "request body is not valid JSON") from None
