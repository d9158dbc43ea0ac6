"""The whole service in one object: registry, device listener, host listener, MCP server.

``Gateway`` owns the long-lived parts (store, registry, MCP session manager, the task that
forwards registry changes to MCP sessions). ``running()`` adds the two uvicorn listeners on
sockets bound up front, so that a port in use is a clear error and port 0 works in tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Iterator
from types import TracebackType

import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from gateway.audit import AuditLog
from gateway.config import Config, ListenAddress
from gateway.devices.calls import CallRouter
from gateway.devices.connection import DeviceConnection
from gateway.devices.link import DeviceIdentity, DeviceLink
from gateway.devices.registry import DeviceRegistry
from gateway.devices.store import Store
from gateway.errors import ConfigError, GatewayError
from gateway.host_app import build_host_app
from gateway.mcp_server import McpFrontend
from gateway.protocol import DeviceProtocol
from gateway.tokens import device_tokens
from gateway.transports.websocket import DEVICE_PATH, device_websocket_routes

__all__ = ["Gateway", "running"]

logger = logging.getLogger(__name__)

# Server pings keep NAT mappings and dead-peer detection alive (devices answer pings, never send
# them: xiaozhi-protocol.md §1).
_PING_INTERVAL = 20.0


class Gateway:
    """The gateway's long-lived state; ``async with Gateway(config) as gw`` sets it all up."""

    def __init__(self, config: Config) -> None:
        if not config.host_listen.is_loopback and not config.host_token:
            raise ConfigError(
                "host_token",
                f"host_listen is {config.host_listen}, which is not loopback: set "
                "GATEWAY_HOST_TOKEN (or host_token) so that only your MCP hosts can call devices",
            )
        self.config = config
        self.device_tokens = device_tokens(config)
        self.store = Store(config.data_dir / "registry.sqlite3")
        self.audit = AuditLog(config.data_dir / "audit.log" if config.audit_log else None)
        self.registry = DeviceRegistry(config, self.store)
        self.router = CallRouter(config, self.audit)
        self.frontend = McpFrontend(config, self.registry, self.router)
        self.device_app = self._build_device_app()
        self.host_app, self._manager = build_host_app(
            config, self.frontend, self.registry, self.router
        )
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> Gateway:
        await self._stack.enter_async_context(self._manager.run())
        forwarder = asyncio.create_task(
            self.frontend.forward_changes(), name="gateway.mcp.forward_changes"
        )
        self._stack.push_async_callback(_cancel, forwarder)
        self._stack.callback(self.store.close)
        self._stack.callback(self.audit.close)
        self._stack.callback(self.frontend.notifier.listen_handler.close)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stack.aclose()

    async def serve_device(self, link: DeviceLink, identity: DeviceIdentity) -> None:
        """Run one device connection until its link closes."""
        log = logging.LoggerAdapter(
            logging.getLogger("gateway.device"), {"device": identity.device_id}
        )
        protocol = DeviceProtocol(
            identity.device_id,
            transport=identity.transport,
            max_message_bytes=self.config.max_message_bytes,
            logger=log,
        )
        connection = DeviceConnection(
            link,
            identity,
            self.registry,
            protocol=protocol,
            hello_timeout=self.config.hello_timeout,
            discovery_timeout=self.config.discovery_timeout,
        )
        await connection.run()

    def _build_device_app(self) -> Starlette:
        async def health(request: object) -> JSONResponse:
            return JSONResponse({"status": "ok"})

        routes = device_websocket_routes(lambda: self.device_tokens, self.serve_device)
        return Starlette(routes=[*routes, Route("/healthz", health)])


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


class _Listener(uvicorn.Server):
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


def bind(address: ListenAddress) -> socket.socket:
    """A listening socket for ``address`` (port 0 picks a free port).

    Raises:
        GatewayError: the address cannot be bound (in use, not ours, no permission).
    """
    try:
        infos = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)
        family, kind, proto, _, sockaddr = infos[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
    except OSError as exc:
        raise GatewayError(f"cannot listen on {address}: {exc.strerror or exc}") from None
    sock.listen(128)
    return sock


def _uvicorn_config(app: Starlette, config: Config) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        lifespan="off",  # Gateway owns the lifespan of everything
        log_config=None,  # keep the CLI's logging: stderr only (stdout is MCP in stdio mode)
        log_level="warning",
        access_log=False,
        ws="websockets-sansio",
        ws_max_size=config.max_message_bytes,  # bigger frames close with 1009
        ws_ping_interval=_PING_INTERVAL,
        ws_ping_timeout=_PING_INTERVAL,
        timeout_graceful_shutdown=2,
    )


class Running:
    """A started gateway: its state plus the ports it really listens on."""

    def __init__(self, gateway: Gateway, device_port: int, host_port: int) -> None:
        self.gateway = gateway
        self.device_port = device_port
        self.host_port = host_port

    @property
    def device_url(self) -> str:
        """The device WebSocket URL on this machine."""
        return f"ws://127.0.0.1:{self.device_port}{DEVICE_PATH}"

    @property
    def mcp_url(self) -> str:
        """The streamable-HTTP MCP URL on this machine."""
        return f"http://127.0.0.1:{self.host_port}/mcp"


@contextlib.asynccontextmanager
async def running(config: Config) -> AsyncIterator[Running]:
    """Start the gateway and both listeners; stop them all on exit."""
    sockets = (bind(config.device_listen), bind(config.host_listen))
    async with Gateway(config) as gateway:
        listeners = (
            _Listener(_uvicorn_config(gateway.device_app, config)),
            _Listener(_uvicorn_config(gateway.host_app, config)),
        )
        tasks = [
            asyncio.create_task(server.serve(sockets=[sock]), name=f"gateway.listener[{name}]")
            for server, sock, name in zip(listeners, sockets, ("device", "host"), strict=True)
        ]
        try:
            for server, task in zip(listeners, tasks, strict=True):
                ready = asyncio.create_task(server.ready.wait())
                await asyncio.wait((ready, task), return_when=asyncio.FIRST_COMPLETED)
                if not ready.done():
                    ready.cancel()
                    task.result()  # it stopped before listening: raise why
                    raise GatewayError("a listener stopped while starting")
            ports = [sock.getsockname()[1] for sock in sockets]
            yield Running(gateway, ports[0], ports[1])
        finally:
            for server in listeners:
                server.should_exit = True
            # Open device sockets and MCP streams would hold shutdown for its grace period.
            await asyncio.gather(*tasks, return_exceptions=True)
            for sock in sockets:
                sock.close()
