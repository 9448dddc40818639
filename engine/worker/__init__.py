"""``kvgate worker``: the engine core in its own process behind an internal, authenticated API.

``server.py`` serves an ``AsyncEngine`` over HTTP/1.1 (aiohttp), ``wire.py`` is the protocol's
payloads and frames, ``events.py`` the KV event stream, ``load.py`` the load report, ``main.py``
runs a worker process. The gateway's client side is ``gateway/cluster/``.
"""
