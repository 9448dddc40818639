"""``kvgate worker``: the engine core in its own process, behind an authenticated transport.

``transport.py`` serves an ``AsyncEngine`` to gateways over ZeroMQ (CURVE keys from ``curve.py``),
``messages.py`` declares every protocol message and its codec, ``server.py`` the worker's state
and its HTTP probes (aiohttp), ``events.py`` the KV event fan-out, ``load.py`` the load report,
``main.py`` runs a worker process. The gateway's side is ``gateway/cluster/`` (``channel.py``,
``client.py``).
"""
