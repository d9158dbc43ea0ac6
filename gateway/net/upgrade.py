"""A WebSocket handshake parsed once: straight from the socket's bytes to the WebSocket protocol.

uvicorn's h11 protocol parses every request, and for a WebSocket upgrade it then writes the
request back out as bytes for the WebSocket protocol (websockets' ``ServerProtocol``) to parse
again. A device joining pays for both parses, an ``h11.Connection`` and an HTTP scope nobody
reads. ``DirectUpgrade`` looks at the first bytes a connection sends: when they are one whole
``GET`` request that asks for a WebSocket as uvicorn would upgrade it (``Connection`` naming
``upgrade``, ``Upgrade: websocket``), they go to the WebSocket protocol as they came, which
parses and checks them as it always did (a handshake it cannot read is answered 400). Likewise
a first packet that is one whole plain ``POST`` to a target the listener answers directly (the
OTA check-in: ``DirectRequests``, gateway/net/direct_http.py) is answered at once, with no h11
and no ASGI scope or task. Anything else (a request in pieces, pipelined bytes, other HTTP)
takes uvicorn's h11 path unchanged.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import ClassVar, Protocol

import h11
from uvicorn.config import Config

from gateway.compat.uvicorn import H11Protocol, ServerState
from gateway.net.direct_http import DirectPost, DirectRequests, direct_post, response_bytes

__all__ = ["DirectUpgrade", "SocketRoutes", "websocket_upgrade"]

_END = b"\r\n\r\n"
_INVALID = b"Invalid HTTP request received."
_BAD_REQUEST = (  # what uvicorn's h11 path answers a request it cannot parse
    b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_INVALID), _INVALID)
)


class _InternalError:
    """What Starlette's error middleware answers when a handler raises (debug off)."""

    status_code = 500
    body = b"Internal Server Error"
    raw_headers = ((b"content-length", b"21"), (b"content-type", b"text/plain; charset=utf-8"))


def websocket_upgrade(data: bytes) -> bytes | None:
    """``data`` with its header names in lower case, if it is exactly one complete ``GET``
    request for a WebSocket upgrade; else None.

    Mirrors uvicorn's own test (``H11Protocol._should_upgrade``): the last ``Connection`` header
    names the ``upgrade`` token and the last ``Upgrade`` header is ``websocket``. The names are
    lowered because uvicorn's WebSocket protocol puts them in the ASGI scope as it parses them,
    and ASGI (the device route's header lookups too) wants them lower case, as h11 gives them.
    """
    if not data.startswith(b"GET ") or data.find(_END) != len(data) - len(_END):
        return None
    lines = data[: -len(_END)].split(b"\r\n")
    connection: list[bytes] = []
    upgrade = None
    for index in range(1, len(lines)):
        name, colon, value = lines[index].partition(b":")
        if not colon:
            return None  # not a header line: h11 answers it with its 400
        name = name.lower()
        lines[index] = name + b":" + value
        if name == b"connection":
            connection = [token.strip().lower() for token in value.split(b",")]
        elif name == b"upgrade":
            upgrade = value.strip().lower()
    if upgrade != b"websocket" or b"upgrade" not in connection:
        return None
    lines.append(b"")
    lines.append(b"")
    return b"\r\n".join(lines)


class SocketRoutes(Protocol):
    """WebSocket paths a listener serves itself, with no ASGI app in between."""

    def protocol_for(
        self, target: bytes, config: Config, state: ServerState
    ) -> asyncio.Protocol | None:
        """A new protocol for a handshake asking for ``target`` (its path and query), or None
        to leave it to the ASGI app. ``config``: the listener's WebSocket settings (``ws_*``);
        ``state``: its connections and tasks, which uvicorn closes and awaits on shutdown."""
        ...


class DirectUpgrade(H11Protocol):
    """uvicorn's h11 protocol, handing a connection's WebSocket handshake over unparsed."""

    sockets: ClassVar[SocketRoutes | None] = None  # paths served below ASGI
    requests: ClassVar[DirectRequests | None] = None  # POST targets answered below ASGI
    _fresh = True  # no bytes received yet on this connection
    # A direct POST whose body has not all come: the request, its head as it came, its body
    _due: tuple[DirectPost, bytes, bytearray] | None = None

    def data_received(self, data: bytes) -> None:
        """A first request that is a whole WebSocket handshake, or a plain POST to a directly
        answered target (its head whole in the first packet), skips h11."""
        if self._fresh:
            self._fresh = False
            request = websocket_upgrade(data) if self.ws_protocol_class is not None else None
            if request is not None:
                self.upgrade(request)
                return
            # uvicorn's concurrency limit and access log live in the h11 path: not skipped
            if self.requests is not None and self.limit_concurrency is None and not self.access_log:
                self._direct(data)
                return
        elif self._due is not None:  # the rest of a direct POST's body
            self._more_body(data)
            return
        super().data_received(data)

    def _direct(self, data: bytes) -> None:
        """Answer a whole direct POST, wait for the rest of its body, or leave it to h11."""
        assert self.requests is not None
        post = direct_post(data, self.requests)
        if post is None:
            super().data_received(data)  # h11 has seen nothing yet: it reads it all
            return
        self.head_received()
        if post.whole:
            self.answer(post, self.requests)
        else:  # the head is kept as it came, for h11 should more than the body come
            self._due = post, data[: len(data) - len(post.body)], bytearray(post.body)

    def _more_body(self, data: bytes) -> None:
        assert self._due is not None and self.requests is not None
        post, head, body = self._due
        body += data  # appended in place: a body in many small packets is not copied each time
        if len(body) < post.length:
            return
        self._due = None
        if len(body) > post.length:  # bytes after the body: h11 reads it all, as it came
            super().data_received(head + body)
        else:
            self.answer(dataclasses.replace(post, body=bytes(body)), self.requests)

    def head_received(self) -> None:
        """A direct POST's head came whole (where h11 would have read its request)."""

    def answer(self, post: DirectPost, requests: DirectRequests) -> None:
        """Answer ``post`` as the ASGI route would, then carry on as after any response: the
        connection closes if it asked to, else waits for its next request (through h11)."""
        server = self.server_state.default_headers  # uvicorn's date and server headers
        try:
            reply = requests.answer(post, self.client[0] if self.client else None)
        except Exception as exc:  # as uvicorn's and Starlette's error handling answer it
            self.logger.error("Exception in ASGI application\n", exc_info=exc)
            self.transport.write(response_bytes(_InternalError(), server, True))
            self.transport.close()
        else:
            self.transport.write(response_bytes(reply, server, post.keep_alive))
            if not post.keep_alive:
                self.transport.close()
        self.on_response_complete()

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        """A handshake h11 parsed (it came in pieces): written back out, as uvicorn does."""
        output = [event.method, b" ", event.target, b" HTTP/1.1\r\n"]
        for name, value in self.headers:
            output += [name, b": ", value, b"\r\n"]
        output.append(b"\r\n")
        self.upgrade(b"".join(output))

    def upgrade(self, request: bytes) -> asyncio.Protocol:
        """Give the connection and its handshake ``request`` to a new WebSocket protocol."""
        self.connections.discard(self)
        protocol: asyncio.Protocol | None = None
        if self.sockets is not None:  # the request line: "<method> <target> HTTP/1.1"
            start = request.find(b" ") + 1
            target = request[start : request.find(b" ", start)]
            protocol = self.sockets.protocol_for(target, self.config, self.server_state)
        if protocol is None:
            protocol = self.ws_protocol_class(  # type: ignore[call-arg, misc]
                config=self.config, server_state=self.server_state, app_state=self.app_state
            )
        protocol.connection_made(self.transport)
        protocol.data_received(request)
        self.transport.set_protocol(protocol)
        # websockets' parser rejects a request it cannot read (a bad header name, a body, too
        # many headers) by only ending its side: uvicorn's protocol would then wait for the
        # peer. Answer 400 and close, as h11 does for a request it cannot parse.
        if getattr(getattr(protocol, "conn", None), "handshake_exc", None) is not None:
            self.transport.write(_BAD_REQUEST)
            self.transport.close()
        return protocol
