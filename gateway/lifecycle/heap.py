"""The start-up heap is kept out of the garbage collector's full passes.

A full (generation 2) collection walks every tracked object. A gateway holds some 400,000 of them
after start-up (torch, the tokenizer, the app), and a full pass over them stands the event loop
still for 100-250 ms: a pause any client can bring on by sending allocation-heavy bodies (large
JSON documents fill the young generations and, in turn, trigger full passes). Objects alive when
start-up ends live as long as the app, so they are frozen (``gc.freeze``): later full passes walk
only what was made since, a few ms. Unfrozen when the app stops, so that a process which runs
several apps one after another (tests, benchmarks) can still free what each one leaves behind.
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator

from aiohttp import web


async def frozen_startup_heap(app: web.Application) -> AsyncIterator[None]:
    """``cleanup_ctx`` entry, last: freeze what start-up left alive, unfreeze at shutdown."""
    gc.collect()  # what start-up made and dropped is freed, not frozen
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
