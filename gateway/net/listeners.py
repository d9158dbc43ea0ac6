"""The two uvicorn listeners: sockets bound up front, servers started and stopped together.

Binding before anything else starts makes a port in use a clear error, and port 0 works in tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
from collections.abc import AsyncIterator, Iterator, Sequence

import uvicorn
from starlette.types import ASGIApp

from gateway.config import Config, ListenAddress, env_name
from gateway.errors import GatewayError, PortTaken
from gateway.net.direct_http import DirectRequests
from gateway.net.limits import Guard, protocol_classes
from gateway.net.peer import RecordPeer
from gateway.net.upgrade import SocketRoutes

__all__ = ["LISTEN_BACKLOG", "Listener", "bind", "listening", "uvicorn_config"]

# Server pings keep NAT mappings and dead-peer detection alive (devices answer pings, never send
# them: docs/protocol.md §1).
_PING_INTERVAL = 20.0
# Connections the kernel queues for a listener until it accepts them (uvicorn's default): a fleet
# joining at once arrives faster than one loop accepts, and past the queue a connection attempt
# is dropped and retried by the device's TCP a second later, then three (the tail of a storm).
LISTEN_BACKLOG = 2048


class Listener(uvicorn.Server):
    """A uvicorn server that leaves signals to the CLI and says when it is listening."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # two servers share one process: the CLI handles SIGINT/SIGTERM for both

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self.ready.set()


class _Config(uvicorn.Config):
    """A listener's uvicorn config: the socket's address is kept before proxy headers replace
    it (``gateway.net.peer``), for the decisions that trust an address."""

    def load(self) -> None:
        super().load()
        self.loaded_app = RecordPeer(self.loaded_app)


def bind(address: ListenAddress, listener: str = "device") -> socket.socket:
    """A listening socket for ``address`` (port 0 picks a free port).

    Raises:
        PortTaken: another program listens there.
        GatewayError: the address cannot be bound (not ours, no permission).
    """
    try:
        infos = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)
        family, kind, proto, _, sockaddr = infos[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            flag = f"--{listener}-listen"
            raise PortTaken(
                f"the {listener} listener cannot use port {address.port}: another program (a "
                f"gateway already running?) listens on {address}; stop it, or move this one "
                f"({flag} HOST:PORT, or {env_name('', f'{listener}_listen')})",
                listener,
            ) from None
        raise GatewayError(f"cannot listen on {address}: {exc.strerror or exc}") from None
    sock.listen(LISTEN_BACKLOG)
    return sock


def uvicorn_config(
    app: ASGIApp,
    config: Config,
    guard: Guard,
    sockets: SocketRoutes | None = None,
    requests: DirectRequests | None = None,
) -> uvicorn.Config:
    """How a listener serves ``app``: ``guard``'s caps and deadlines, no lifespan, no logs;
    ``sockets``, WebSocket paths it serves below ``app`` (the device WebSocket); ``requests``,
    POST targets it answers below ``app`` (the OTA check-in)."""
    # Caps, handshake and authentication deadlines at the transport (gateway/net/limits.py).
    http, ws = protocol_classes(guard, sockets, requests)
    return _Config(
        app,
        http=http,
        backlog=LISTEN_BACKLOG,  # asyncio listens again with it on the socket handed over
        lifespan="off",  # Gateway owns the lifespan of everything
        log_config=None,  # keep the CLI's logging: stderr only (stdout is MCP in stdio mode)
        log_level="warning",
        access_log=False,
        ws=ws,  # websockets-sansio, lean for idle fleets (gateway/net/websocket.py)
        ws_max_size=config.max_message_bytes,  # bigger frames close with 1009
        ws_ping_interval=_PING_INTERVAL,
        ws_ping_timeout=_PING_INTERVAL,
        timeout_graceful_shutdown=2,
    )


@contextlib.asynccontextmanager
async def listening(
    served: Sequence[tuple[str, uvicorn.Config, socket.socket]],
) -> AsyncIterator[list[int]]:
    """Serve each ``(name, config, socket)`` until exit; yield the ports, once all listen.

    Raises:
        GatewayError: a listener stopped before it was listening (or why it stopped).
    """
    listeners = [Listener(config) for _, config, _ in served]
    tasks = [
        asyncio.create_task(server.serve(sockets=[sock]), name=f"gateway.listener[{name}]")
        for server, (name, _, sock) in zip(listeners, served, strict=True)
    ]
    try:
        for server, task in zip(listeners, tasks, strict=True):
            ready = asyncio.create_task(server.ready.wait())
            await asyncio.wait((ready, task), return_when=asyncio.FIRST_COMPLETED)
            if not ready.done():
                ready.cancel()
                task.result()  # it stopped before listening: raise why
                raise GatewayError("a listener stopped while starting")
        yield [sock.getsockname()[1] for _, _, sock in served]
    finally:
        for server in listeners:
            server.should_exit = True
        # Open device sockets and MCP streams would hold shutdown for its grace period.
        await asyncio.gather(*tasks, return_exceptions=True)
        for _, _, sock in served:
            sock.close()
