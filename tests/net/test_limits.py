"""Listener limits on a bare uvicorn with the guarded protocols: real sockets, short deadlines."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from websockets.asyncio.client import connect

from gateway.net.expiries import Expiries
from gateway.net.limits import (
    Guard,
    ListenerLimits,
    Slot,
    ThrottledLog,
    in_networks,
    listener_limits,
    networks,
    protocol_classes,
)
from gateway.net.listeners import Listener
from gateway.net.upgrade import SocketRoutes
from tests.conftest import bound, make_config

pytestmark = pytest.mark.anyio

LIMITS = ListenerLimits(
    name="test", max_connections=100, per_address=100, handshake_timeout=0.2, auth_timeout=10.0
)
READ_NOW = asyncio.Event()
PARTIAL = b"GET / HTTP/1.1\r\nHost: x\r\n"  # the headers never end
REQUEST = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """200 "ok" for HTTP; a WebSocket to /deny is refused, any other is accepted and held."""
    if scope["type"] == "http":
        headers = [(b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok"})
        return
    await receive()
    if scope["path"] == "/deny":
        await send({"type": "websocket.close"})
        return
    await send({"type": "websocket.accept"})
    if scope["path"] == "/later":  # reads nothing until the client says so over HTTP
        await READ_NOW.wait()
    while (message := await receive())["type"] != "websocket.disconnect":
        if scope["path"] in ("/echo", "/later"):
            await send({"type": "websocket.send", "text": message["text"]})


class WatchedGuard(Guard):
    """A guard that says when its count of connections changes."""

    def __init__(self, limits: ListenerLimits) -> None:
        self.changed = asyncio.Event()
        super().__init__(limits)

    @property
    def connections(self) -> int:
        return self._connections

    @connections.setter
    def connections(self, value: int) -> None:
        self._connections = value
        self.changed.set()

    async def until(self, connections: int) -> None:
        """Wait until ``connections`` are open."""
        async with asyncio.timeout(bound(5)):
            while self.connections != connections:
                self.changed.clear()
                await self.changed.wait()


@asynccontextmanager
async def serving(
    limits: ListenerLimits, sockets: SocketRoutes | None = None, **settings: Any
) -> AsyncIterator[tuple[int, WatchedGuard]]:
    """A uvicorn on a free loopback port with ``limits`` (the WebSocket paths of ``sockets``
    served below ASGI, and uvicorn ``settings``); yields its port and guard."""
    guard = WatchedGuard(limits)
    http, ws = protocol_classes(guard, sockets)
    config = uvicorn.Config(app, http=http, ws=ws, lifespan="off", log_config=None,
                            log_level="warning", timeout_graceful_shutdown=1,
                            **settings)  # fmt: skip
    server = Listener(config)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(bound(5)):
            await server.ready.wait()
        yield sock.getsockname()[1], guard
    finally:
        server.should_exit = True
        await asyncio.gather(task, return_exceptions=True)
        sock.close()


async def opened(port: int, data: bytes = b"") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw connection that has sent ``data``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if data:
        writer.write(data)
        await writer.drain()
    return reader, writer


async def closed_by_server(reader: asyncio.StreamReader, seconds: float = 5) -> bytes:
    """Wait until the server closes the connection; return what it sent before."""
    received = b""
    async with asyncio.timeout(bound(seconds)):
        try:
            while chunk := await reader.read(65536):
                received += chunk
        except ConnectionResetError:
            pass
    return received


async def answered(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes = REQUEST
) -> bool:
    """Send (the rest of) a request on an open connection: True when it is answered 200."""
    writer.write(request)
    await writer.drain()
    async with asyncio.timeout(bound(5)):
        head = await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)
    return head.startswith(b"HTTP/1.1 200")


async def test_a_request_whose_headers_never_end_is_closed_at_the_handshake_deadline() -> None:
    """Slow-loris: partial headers are cut off after handshake_timeout, not before."""
    async with serving(LIMITS) as (port, guard):
        loop = asyncio.get_running_loop()
        start = loop.time()
        reader, writer = await opened(port, PARTIAL)
        assert await closed_by_server(reader) == b""
        assert loop.time() - start >= LIMITS.handshake_timeout * 0.9
        writer.close()
        assert guard.connections == 0 and guard.unauthenticated == {}


async def test_a_kept_alive_connection_gets_a_new_deadline_for_each_request() -> None:
    """A served request does not exempt the next one: its headers have the same deadline."""
    async with serving(LIMITS) as (port, _):
        reader, writer = await opened(port)
        assert await answered(reader, writer)
        writer.write(PARTIAL)
        assert await closed_by_server(reader) == b""
        writer.close()


async def test_connections_and_their_requests_share_the_listeners_two_deadline_timers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Deadlines cost a connection no timer of its own, nor one per request: the listener's
    handshake and authentication deadlines each share one timer (a host opens a connection per
    tool call, issue 29), however many connections come and go, and a deadline still fires."""
    loop = asyncio.get_running_loop()
    armed: list[object] = []
    call_at = loop.call_at

    def counting(when: float, callback: Any, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        if isinstance(getattr(callback, "__self__", None), (Slot, Expiries)):
            armed.append(callback)
        return call_at(when, callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_at", counting)
    async with serving(replace(LIMITS, handshake_timeout=60.0, auth_timeout=120.0)) as (
        port,
        guard,
    ):
        for _ in range(5):
            reader, writer = await opened(port)
            for _ in range(3):
                assert await answered(reader, writer)
            writer.close()
            await guard.until(0)
    assert len(armed) == 2  # handshake, auth: once each, for the first connection


async def test_a_connection_that_never_authenticates_is_closed_at_the_auth_deadline() -> None:
    """Plain requests never authenticate on a device listener: auth_timeout ends them."""
    limits = replace(LIMITS, handshake_timeout=5.0, auth_timeout=0.3)
    async with serving(limits) as (port, guard):
        reader, writer = await opened(port)
        assert await answered(reader, writer)
        assert await closed_by_server(reader) == b""
        writer.close()
        async with connect(f"ws://127.0.0.1:{port}/ok") as ws:  # accepted: authenticated
            held = await opened(port)
            assert await closed_by_server(held[0]) == b""  # outlived by the WebSocket
            held[1].close()
            assert guard.connections == 1 and guard.unauthenticated == {}
            await ws.send("still here")


async def test_past_the_listener_cap_new_connections_are_closed_at_once() -> None:
    """max_connections open: the next one is aborted before any request, the rest stay."""
    limits = replace(LIMITS, max_connections=3, handshake_timeout=10.0)
    async with serving(limits) as (port, guard):
        held = [await opened(port) for _ in range(3)]
        extra, extra_writer = await opened(port, REQUEST)
        assert await closed_by_server(extra, 2) == b""
        assert guard.connections == 3
        assert all([await answered(*connection) for connection in held])
        for _, writer in held:
            writer.close()
        extra_writer.close()


async def test_the_per_address_cap_counts_only_connections_not_yet_authenticated() -> None:
    """Accepted WebSockets do not count; a closed connection frees its place; exempt passes."""
    limits = replace(LIMITS, per_address=2, handshake_timeout=10.0)
    async with serving(limits) as (port, guard):
        async with connect(f"ws://127.0.0.1:{port}/ok"), connect(f"ws://127.0.0.1:{port}/ok"):
            first, second = [await opened(port, PARTIAL) for _ in range(2)]
            assert guard.unauthenticated == {"127.0.0.1": 2} and guard.connections == 4
            extra, extra_writer = await opened(port)
            assert await closed_by_server(extra, 2) == b""
            extra_writer.close()
            first[1].close()
            await guard.until(3)  # the server saw it go
            assert guard.unauthenticated == {"127.0.0.1": 1}
            again = await opened(port)
            assert await answered(*again)
            assert await answered(*second, b"\r\n")  # the held one was served all along
            for _, writer in (second, again):
                writer.close()
    exempt = replace(limits, exempt=networks(["127.0.0.0/8"]))
    async with serving(exempt) as (port, guard):
        held = [await opened(port) for _ in range(4)]
        assert all([await answered(*connection) for connection in held])
        assert guard.unauthenticated == {}
        for _, writer in held:
            writer.close()


async def test_a_request_with_the_bearer_token_authenticates_its_connection() -> None:
    """Host listener: the host token in a request lifts the auth deadline and the count."""
    limits = replace(
        LIMITS, trust_requests=True, bearer="s3cret", handshake_timeout=5.0, auth_timeout=0.3
    )
    with_token = REQUEST.replace(b"\r\n\r\n", b"\r\nAuthorization: Bearer s3cret\r\n\r\n")
    async with serving(limits) as (port, guard):
        wrong = await opened(port)
        right = await opened(port)
        assert await answered(*right, with_token)
        assert await answered(*wrong, REQUEST.replace(b"\r\n\r\n", b"\r\nAuthorization: x\r\n\r\n"))
        assert await closed_by_server(wrong[0]) == b""  # the auth deadline
        assert guard.unauthenticated == {} and guard.connections == 1
        assert await answered(*right)  # outlived it
        for _, writer in (wrong, right):
            writer.close()


def test_trust_rules_for_each_listener(tmp_path: Path) -> None:
    """Device requests never authenticate; host ones do with the token, or always without."""
    config = make_config(tmp_path, host_token="t")
    device, host = listener_limits(config, "device"), listener_limits(config, "host")
    with_token = [(b"authorization", b"bearer t")]
    assert not device.trusts(with_token)
    assert host.trusts(with_token) and not host.trusts([(b"authorization", b"Bearer u")])
    assert not host.trusts([])
    open_host = listener_limits(replace(config, host_token=None), "host")
    assert open_host.trusts([])
    assert device.max_connections == 12000 and host.max_connections == 1000


def test_exempt_networks_match_ipv4_mapped_addresses() -> None:
    """::ffff:127.0.0.1 (a dual-stack listener) is loopback too; junk matches nothing."""
    nets = networks(["127.0.0.0/8", "::1"])
    assert in_networks("::ffff:127.0.0.1", nets) and in_networks("::1", nets)
    assert not in_networks("10.0.0.1", nets) and not in_networks("", nets)


def test_throttled_log_logs_each_kind_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    """A storm is one line per interval, and the next line says how many were held back."""
    now = [0.0]
    log = ThrottledLog(logging.getLogger("test.throttled"), 10.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, "test.throttled")
    assert [log.warning("a", "event %d", n) for n in range(1000)].count(True) == 1
    assert log.warning("b", "other kind")
    now[0] = 10.0
    assert log.warning("a", "event %d", 1000)
    assert [r.getMessage() for r in caplog.records] == [
        "event 0",
        "other kind",
        "event 1000 (and 999 more like it in the last 10 s)",
    ]


async def test_a_websocket_stops_reading_only_when_its_app_falls_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An app that keeps up never makes the socket stop and start reading (two epoll changes a
    message in uvicorn); an app that falls behind still does, and loses nothing."""
    pauses: list[object] = []
    paused = asyncio.Event()
    pause = asyncio.selector_events._SelectorSocketTransport.pause_reading  # type: ignore[attr-defined]

    def counted(transport: asyncio.Transport) -> None:
        pauses.append(transport)
        paused.set()
        pause(transport)

    monkeypatch.setattr(asyncio.selector_events._SelectorSocketTransport, "pause_reading", counted)  # type: ignore[attr-defined]
    READ_NOW.clear()
    async with serving(LIMITS) as (port, _):
        async with connect(f"ws://127.0.0.1:{port}/echo") as ws, asyncio.timeout(bound(5)):
            for n in range(20):
                await ws.send(f"m{n}")
                assert await ws.recv() == f"m{n}"
        assert pauses == []
        async with connect(f"ws://127.0.0.1:{port}/later") as ws, asyncio.timeout(bound(5)):
            for n in range(20):
                await ws.send(f"m{n}")
            await paused.wait()  # the app reads nothing yet: the server stops reading
            READ_NOW.set()
            assert [await ws.recv() for _ in range(20)] == [f"m{n}" for n in range(20)]
        assert len(pauses) >= 1
