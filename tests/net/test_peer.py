"""The socket's address kept before uvicorn's proxy headers replace a request's client."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.requests import HTTPConnection
from starlette.types import Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from gateway.net.peer import RecordPeer, socket_peer

pytestmark = pytest.mark.anyio


async def test_the_socket_peer_outlives_a_forwarded_address() -> None:
    """From a trusted proxy (127.0.0.1) X-Forwarded-For becomes the client; the socket's
    address stays what ``socket_peer`` answers."""
    seen: list[HTTPConnection] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(HTTPConnection(scope))

    served = RecordPeer(ProxyHeadersMiddleware(app, "127.0.0.1"))  # type: ignore[arg-type]
    scope: dict[str, Any] = {"type": "http", "client": ("127.0.0.1", 5000), "scheme": "http",
                             "headers": [(b"x-forwarded-for", b"172.30.32.2")]}  # fmt: skip
    await served(scope, _nothing, _nothing)
    assert seen[0].client is not None and seen[0].client.host == "172.30.32.2"
    assert socket_peer(seen[0]) == "127.0.0.1"


def test_a_request_that_came_through_no_listener_has_no_peer_to_trust() -> None:
    """No socket address recorded (no listener, or a client-less scope): nothing to trust."""
    assert socket_peer(HTTPConnection({"type": "http", "client": ("172.30.32.2", 1)})) == ""
    served_without_client = {"type": "http", "client": None, "gateway.peer": None}
    assert socket_peer(HTTPConnection(served_without_client)) == ""


async def _nothing(*args: object) -> None:
    raise AssertionError("not called")
