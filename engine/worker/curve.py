"""CURVE keys of the worker transport, derived from ``KVGATE_WORKER_TOKEN``.

Every party that knows the token derives the same two key pairs: the worker's (server) and the
gateways' (client). A gateway connects with the server's public key and the client pair; the
worker's ZAP handler (engine/worker/transport.py) admits only the derived client key, compared in
constant time. So knowing the token is what authenticates a connection, as the bearer token did
on HTTP, and every message on it is then authenticated and encrypted by CurveZMQ (a peer without
the token can neither complete the handshake nor read or forge a frame).
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from hashlib import blake2b

import zmq
from zmq.utils import z85


@dataclass(frozen=True)
class CurveKeys:
    server_public: bytes  # Z85 text, as libzmq takes keys
    server_secret: bytes
    client_public: bytes
    client_secret: bytes

    def admits(self, client_public: bytes) -> bool:
        """Whether a connecting peer presented the gateways' key (constant time)."""
        return hmac.compare_digest(client_public, self.client_public)


def _pair(token: str, role: bytes) -> tuple[bytes, bytes]:
    secret = z85.encode(blake2b(token.encode(), digest_size=32, person=b"kvgate-" + role).digest())
    return zmq.curve_public(secret), secret


def curve_keys(token: str) -> CurveKeys:
    if not token:
        raise ValueError("the worker transport needs a token (KVGATE_WORKER_TOKEN)")
    server_public, server_secret = _pair(token, b"server")
    client_public, client_secret = _pair(token, b"client")
    return CurveKeys(server_public, server_secret, client_public, client_secret)
