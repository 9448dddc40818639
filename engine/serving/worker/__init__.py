"""``kvgate worker``: the engine core in its own process, behind an authenticated transport.

``transport.py`` serves an ``AsyncEngine`` to gateways over one WebSocket each, ``messages.py``
declares every protocol message and its codec, ``server.py`` the worker's aiohttp app (probes and
the transport on one port), ``state.py`` what they share, ``events.py`` the KV event fan-out,
``load.py`` the load report, ``main.py`` runs a worker process. The gateway's side is
``gateway/cluster/`` (``channel.py``, ``client.py``).
"""
