"""The address a request's socket came from, whatever its ``X-Forwarded-For`` says.

uvicorn's proxy-headers middleware (on for both listeners) replaces a request's client by the
address in ``X-Forwarded-For`` when the request comes from a trusted proxy (``127.0.0.1`` by
default), so any local process can claim any address there. That address is right for what is
only counted or shown (rates per client, the audit log), never for trust: a decision that trusts
an address (Home Assistant's ingress proxy, a TLS proxy in ``trusted_proxies``) reads
``socket_peer``, which ``RecordPeer`` keeps before that middleware runs.
"""

from __future__ import annotations

from collections.abc import Awaitable

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["PEER", "RecordPeer", "socket_peer"]

PEER = "gateway.peer"
"""The scope key of the socket's ``(host, port)``, as uvicorn saw it (None: not a socket)."""


class RecordPeer:
    """Keeps the socket's address in the scope (``PEER``); the listeners' outermost layer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        # Not a coroutine: no frame of its own for as long as a request (or WebSocket) lives.
        scope[PEER] = scope.get("client")
        return self.app(scope, receive, send)


def socket_peer(conn: HTTPConnection) -> str:
    """The host of the socket ``conn`` came in on, or "" when unknown (then nothing trusts it)."""
    peer = conn.scope.get(PEER)
    return str(peer[0]) if peer else ""
