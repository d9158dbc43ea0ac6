"""The device WebSocket at ``/xiaozhi/v1/``: authenticate, accept, and run a DeviceConnection.

Stock firmware sends its identity and token as headers (``Authorization``, ``Device-Id``,
``Client-Id``, ``Protocol-Version``; docs/protocol.md §1); some clients send the same as query
parameters instead. A device without a valid token is refused before the upgrade (HTTP 403).

The listener serves the device path below ASGI (``device_sockets``: a ``DeviceSocket`` per
connection, gateway/device_side/transports/device_socket.py), beside voice servers too: the
proxy takes a proxied device's socket over through ``RelayedSocket``, the part of a Starlette
``WebSocket`` the relay uses. One WebSocket stack serves every device.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote

import uvicorn
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware
from websockets.extensions.base import ServerExtensionFactory
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory
from websockets.server import ServerProtocol

from gateway.compat.uvicorn import ServerState
from gateway.device_side.broker.topics import is_device_id
from gateway.device_side.transports.device_socket import DeviceSocket, Endpoint
from gateway.device_side.upstream.relay import ProxiedWebSocket
from gateway.devices.link import DeviceIdentity
from gateway.net.addresses import DEVICE_PATH
from gateway.net.direct_http import DirectRequests
from gateway.net.websocket import keepalive

__all__ = [
    "DeviceSocketFront",
    "Proxied",
    "RelayedSocket",
    "DeviceSockets",
    "authenticate",
    "device_sockets",
]

logger = logging.getLogger(__name__)
_UVICORN_LOG = logging.getLogger("uvicorn.error")


def _first(*values: str | None) -> str | None:
    return next((v for v in values if v), None)


Admit = Callable[[DeviceIdentity, str, str | None], str | None]
"""``admit(identity, token, peer)``: None when this device may connect with this token (from
address ``peer``), else why not."""


def authenticate(
    headers: Mapping[str, str], query: Mapping[str, str], admit: Admit, peer: str | None = None
) -> DeviceIdentity | str:
    """The device's identity if it is admitted, else the reason to refuse it."""
    device_id = _first(headers.get("device-id"), query.get("device-id"), query.get("device_id"))
    if not device_id or not is_device_id(device_id.lower()):
        return "missing or malformed Device-Id"
    authorization = _first(headers.get("authorization"), query.get("authorization"))
    token = _first(query.get("token"))
    if authorization:
        # Stock firmware sends "Bearer <token>", or the token verbatim if it holds a space.
        token = authorization.removeprefix("Bearer ").strip()
    identity = DeviceIdentity(
        device_id=device_id.lower(),
        client_id=_first(headers.get("client-id"), query.get("client-id"), query.get("client_id")),
        transport="websocket",
        host=headers.get("host"),
    )
    if not token:
        return "missing device token"
    refusal = admit(identity, token, peer)
    return identity if refusal is None else refusal


Proxied = Callable[[DeviceIdentity], Callable[[ProxiedWebSocket], Awaitable[None]] | None]
"""``proxied(identity)``: the conversation that takes a proxied device's WebSocket over (it
accepts or refuses it itself), or None when the gateway serves the device alone."""


class RelayedSocket:
    """A ``DeviceSocket`` as the voice proxy takes it over (``ProxiedWebSocket``): binary
    (audio) messages kept and sent too, the ASGI messages the relay reads."""

    def __init__(self, socket: DeviceSocket, headers: Mapping[str, str]) -> None:
        self._socket = socket
        self._headers = headers
        socket.keep_binary()

    @property
    def headers(self) -> Mapping[str, str]:
        """The handshake's headers, by lower-case name (the first of repeated ones)."""
        return self._headers

    async def accept(self) -> None:
        """Accept the WebSocket (101); a device gone meanwhile reads as a disconnect."""
        self._socket.accept()

    async def send_denial_response(self, response: Response) -> None:
        """Refuse the handshake with ``response``'s status and text."""
        self._socket.refuse(response.status_code, bytes(response.body).decode())

    async def receive(self) -> Mapping[str, Any]:
        """The next message, as ASGI gives it."""
        message = await self._socket.receive()
        if message is None:
            return {"type": "websocket.disconnect", "code": self._socket.conn.close_code or 1006}
        if isinstance(message, bytes):
            return {"type": "websocket.receive", "bytes": message}
        return {"type": "websocket.receive", "text": message}

    async def send_text(self, data: str) -> None:
        """Send a text frame."""
        await self._socket.send(data)

    async def send_bytes(self, data: bytes) -> None:
        """Send a binary frame."""
        await self._socket.send_bytes(data)

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        """Close the WebSocket: 1000 with the closing handshake, another ``code`` failing it at
        once (RFC 6455 7.1.7); before it is accepted, refuse it (HTTP 403)."""
        if code != 1000 and self._socket.handshake_complete:
            self._socket.fail(code, reason or "")
            return
        await self._socket.aclose()


def _deflate() -> list[ServerExtensionFactory]:
    # What uvicorn offers with ws_per_message_deflate (its default): stock firmware never asks.
    return [
        ServerPerMessageDeflateFactory(
            server_max_window_bits=12, client_max_window_bits=12, compress_settings={"memLevel": 5}
        )
    ]


class DeviceSockets:
    """The device paths a listener serves below ASGI (``SocketRoutes``), and their endpoint."""

    def __init__(self, paths: set[str], endpoint: Endpoint) -> None:
        self.paths = frozenset(paths)
        self.endpoint = endpoint
        self._config: uvicorn.Config | None = None  # the listener's, from its first handshake
        self._extensions: list[ServerExtensionFactory] | None = None
        self._proxy: ProxyHeadersMiddleware | None = None

    def protocol_for(
        self, target: bytes, config: uvicorn.Config, state: ServerState
    ) -> asyncio.Protocol | None:
        """A ``DeviceSocket`` for a handshake on a device path, else None."""
        path = target.partition(b"?")[0].decode("latin-1")
        if path not in self.paths and unquote(path) not in self.paths:
            return None
        if config is not self._config:  # what uvicorn works out per connection, once
            self._config = config
            self._extensions = _deflate() if config.ws_per_message_deflate else None
            self._proxy = None
            if config.proxy_headers:
                self._proxy = ProxyHeadersMiddleware(_client, config.forwarded_allow_ips)  # type: ignore[arg-type]
        conn = ServerProtocol(
            extensions=self._extensions,
            max_size=config.ws_max_size,
            # uvicorn's logger, at the listener's level: websockets logs each handshake's
            # headers (the device token) at debug level, never wanted here.
            logger=_UVICORN_LOG,
        )
        interval, wheel = config.ws_ping_interval, None
        if interval is not None and interval > 0:
            wheel = keepalive(asyncio.get_running_loop(), interval, config.ws_ping_timeout)
        return DeviceSocket(self.endpoint, state, conn, wheel, config.ws_max_size)

    async def client(self, socket: DeviceSocket, forwarded: str | None) -> tuple[str, int] | None:
        """The device's address: as uvicorn's proxy headers make it (``X-Forwarded-For`` from
        a trusted proxy, loopback by default), else the peer's."""
        remote = socket.remote
        if forwarded is None or self._proxy is None:
            return remote
        scope: dict[str, Any] = {
            "type": "websocket",
            "client": remote,
            "headers": [(b"x-forwarded-for", forwarded.encode("latin-1"))],
        }
        await self._proxy(scope, _nothing, _nothing)  # type: ignore[arg-type]
        client: tuple[str, int] | None = scope["client"]
        return client


async def _client(scope: Scope, receive: Receive, send: Send) -> None:
    pass  # the scope itself is the answer: ``DeviceSockets.client`` reads its client


async def _nothing(*args: object) -> None:
    raise AssertionError("not called")


def device_sockets(
    admit: Admit,
    serve: Callable[[DeviceSocket, DeviceIdentity], Awaitable[None]],
    settle: Callable[[], Awaitable[None]] | None = None,
    proxied: Proxied | None = None,
) -> DeviceSockets:
    """The device WebSocket served below ASGI; ``serve`` runs a connection for an
    authenticated device, over its ``DeviceSocket``.

    ``settle`` is awaited once a device is admitted, before its WebSocket is accepted (the
    registry commits what the login decided). ``proxied`` takes a proxied device's socket over
    (``RelayedSocket``).
    """

    async def endpoint(socket: DeviceSocket) -> None:
        request = socket.request
        assert request is not None  # until it is accepted or refused
        headers: dict[str, str] = {}  # lower-case names, the first of repeated ones (ASGI's)
        for name, value in request.headers.raw_items():
            headers.setdefault(name.lower(), value)
        forwarded = None
        if "x-forwarded-for" in headers:  # all of them, as uvicorn reads them
            forwarded = ", ".join(request.headers.get_all("x-forwarded-for"))
        client = await sockets.client(socket, forwarded)
        remote = f"{client[0]}:{client[1]}" if client else None
        peer = client[0] if client else None
        query = dict(parse_qsl(request.path.partition("?")[2], keep_blank_values=True))
        identity = authenticate(headers, query, admit, peer)
        if isinstance(identity, str):
            logger.warning("refused device WebSocket from %s: %s", remote, identity)
            socket.refuse()  # HTTP 403
            return
        if settle is not None:  # what the login decided is on disk before it is accepted
            await settle()
        conversation = proxied(identity) if proxied is not None else None
        if conversation is not None:  # beside its voice server (docs/voice-proxy.md)
            await conversation(RelayedSocket(socket, headers))
            return
        if not socket.accept():  # the device left meanwhile
            return
        try:
            await serve(socket, identity)
        except Exception:  # one device's failure is its own (as an MQTT device's): 1011
            logger.exception("WebSocket device %s: session failed", identity.device_id)
            socket.fail()

    sockets = DeviceSockets({DEVICE_PATH, DEVICE_PATH.rstrip("/")}, endpoint)
    return sockets


class DeviceSocketFront:
    """The device listener's ASGI app, with what the listener serves below it: the device
    WebSocket (``sockets``) and the POSTs it answers itself (``requests``, the OTA check-in).

    Every device WebSocket is served below ASGI, so none reaches Starlette's middleware and
    router (each would keep a coroutine frame, with its closures, for as long as a WebSocket
    lives: some kilobytes for every idle device of a fleet); every other request, and a
    WebSocket on any other path, takes the whole app.
    """

    def __init__(
        self, app: ASGIApp, sockets: DeviceSockets, requests: DirectRequests | None = None
    ) -> None:
        self.app = app
        self.sockets = sockets  # the device WebSocket below ASGI, for the listener to serve
        self.requests = requests  # POSTs it answers below ASGI (the OTA check-in)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)
