"""The device WebSocket below ASGI (``DeviceSocket``), on a real gateway: the work it saves, and
what it does with hostile input, byte by byte from a raw socket."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest
import starlette.websockets

from gateway.app import Running
from gateway.device_side.transports.device_socket import DeviceSocket
from gateway.errors import DeviceUnavailable
from tests.conftest import bound, gateway
from tests.e2e.helpers import STOCK_HELLO, listed_device, stock_headers

pytestmark = pytest.mark.anyio

DEVICE = "02:00:00:00:00:31"
TEXT, BINARY, CONT, CLOSE, PING = 0x1, 0x2, 0x0, 0x8, 0x9
HELLO = json.dumps(STOCK_HELLO).encode()


def frame(
    opcode: int, payload: bytes = b"", *, fin: bool = True, length: int | None = None
) -> bytes:
    """A client frame (masked with a zero key, so the payload reads as it is)."""
    size = len(payload) if length is None else length
    head = bytes([(0x80 if fin else 0) | opcode])
    if size < 126:
        head += bytes([0x80 | size])
    elif size < 1 << 16:
        head += bytes([0x80 | 126]) + struct.pack("!H", size)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", size)
    return head + b"\0\0\0\0" + payload


def handshake(path: str = "/xiaozhi/v1/", device_id: str = DEVICE, **extra: str) -> bytes:
    headers = {"Host": "127.0.0.1", "Upgrade": "websocket", "Connection": "Upgrade",
               "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version": "13",
               **stock_headers(device_id), **extra}  # fmt: skip
    lines = [f"GET {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items() if v)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class Peer:
    """A raw device connection: frames out as bytes, the gateway's frames parsed back."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def head(self) -> bytes:
        async with asyncio.timeout(bound(5)):
            return await self.reader.readuntil(b"\r\n\r\n")

    async def frame(self) -> tuple[int, bytes]:
        """The gateway's next frame (opcode, payload); pings are answered on the way."""
        async with asyncio.timeout(bound(5)):
            while True:
                first, second = await self.reader.readexactly(2)
                size = second & 0x7F
                if size == 126:
                    (size,) = struct.unpack("!H", await self.reader.readexactly(2))
                elif size == 127:
                    (size,) = struct.unpack("!Q", await self.reader.readexactly(8))
                payload = await self.reader.readexactly(size)
                if first & 0x0F != PING:
                    return first & 0x0F, payload
                await self.send(frame(0xA, payload))

    async def message(self) -> dict[str, Any]:
        opcode, payload = await self.frame()
        assert opcode == TEXT
        message: dict[str, Any] = json.loads(payload)
        return message

    async def closed(self) -> bytes:
        """What the gateway sent until it closed the connection."""
        received = b""
        async with asyncio.timeout(bound(5)):
            try:
                while chunk := await self.reader.read(65536):
                    received += chunk
            except ConnectionResetError:
                pass
        return received


@asynccontextmanager
async def peer(
    run: Running, request: bytes | None = None, receive_buffer: int | None = None
) -> AsyncIterator[Peer]:
    """A raw connection to the device listener that has sent ``request`` (a valid handshake);
    ``receive_buffer``: its socket's, fixed (the kernel grows it no further)."""
    sock = socket.socket()
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", run.device_port))
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        device = Peer(reader, writer)
        await device.send(handshake() if request is None else request)
        yield device
    finally:
        writer.close()


@asynccontextmanager
async def accepted(run: Running, receive_buffer: int | None = None) -> AsyncIterator[Peer]:
    """A raw device whose handshake the gateway accepted."""
    async with peer(run, receive_buffer=receive_buffer) as device:
        assert (await device.head()).startswith(b"HTTP/1.1 101")
        yield device


@contextmanager
def counting_tasks() -> Iterator[Counter[str]]:
    """The tasks started meanwhile, by coroutine name."""
    loop = asyncio.get_running_loop()
    tasks: Counter[str] = Counter()

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> Any:
        tasks[getattr(coro, "__qualname__", repr(coro))] += 1
        return asyncio.Task(coro, loop=loop, **kw)

    loop.set_task_factory(factory)
    try:
        yield tasks
    finally:
        loop.set_task_factory(None)


async def test_a_device_websocket_runs_in_one_task_with_no_asgi_scope_or_starlette_websocket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A joining device costs one task (its session) and no ASGI layers: no ``run_asgi`` task,
    no scope, no Starlette ``WebSocket`` (and so no message dict per frame)."""
    made: list[object] = []
    init = starlette.websockets.WebSocket.__init__

    def counted(self: starlette.websockets.WebSocket, *args: Any, **kwargs: Any) -> None:
        made.append(self)
        init(self, *args, **kwargs)

    monkeypatch.setattr(starlette.websockets.WebSocket, "__init__", counted)
    async with gateway(tmp_path) as run:
        with counting_tasks() as tasks:
            async with listed_device(run):
                pass
    assert made == []
    assert tasks["DeviceSocket._run"] == 1  # the device's whole session
    assert not any("run_asgi" in name for name in tasks)


async def test_a_message_in_fragments_with_a_ping_between_is_one_message(tmp_path: Path) -> None:
    async with gateway(tmp_path) as run, accepted(run) as device:
        await device.send(frame(BINARY, b"\x01opus", fin=False) + frame(CONT, b"audio"))
        third = len(HELLO) // 3
        await device.send(frame(TEXT, HELLO[:third], fin=False))
        await device.send(frame(PING, b"are you there") + frame(CONT, HELLO[third:-5], fin=False))
        assert await device.frame() == (0xA, b"are you there")  # answered mid-message
        await device.send(frame(CONT, HELLO[-5:]))
        reply = await device.message()
        assert reply["type"] == "hello"  # the audio was ignored, the hello read whole


async def test_an_oversize_message_closes_with_1009_and_another_device_is_unharmed(
    tmp_path: Path,
) -> None:
    """Announced bigger than ``max_message_bytes``: refused from its header, before its
    payload is read, in one frame or across fragments."""
    async with gateway(tmp_path, max_message_bytes=16384) as run, listed_device(run) as other:
        for oversize in (
            frame(TEXT, length=16385),
            frame(TEXT, b"x" * 9000, fin=False) + frame(CONT, b"x" * 9000),
        ):
            async with accepted(run) as device:
                await device.send(oversize)
                opcode, payload = await device.frame()
                assert (opcode, payload[:2]) == (CLOSE, struct.pack("!H", 1009))
                await device.closed()
        assert await _called(run, other.device_id) == 1  # the other device is still served


async def test_invalid_utf8_closes_with_1007(tmp_path: Path) -> None:
    async with gateway(tmp_path) as run, accepted(run) as device:
        await device.send(frame(TEXT, b"{\xff}"))
        opcode, payload = await device.frame()
        assert (opcode, payload[:2]) == (CLOSE, struct.pack("!H", 1007))
        await device.closed()


@pytest.mark.parametrize(
    "request_bytes",
    [
        handshake(**{"Sec-WebSocket-Key": ""}),  # no key
        handshake(**{"Sec-WebSocket-Version": "8"}),  # an old version
        handshake().replace(
            b"Sec-WebSocket-Version", b"Sec-WebSocket-Key: x\r\nSec-WebSocket-Version"
        ),
    ],
)
async def test_a_bad_handshake_on_the_device_path_is_refused_and_closed(
    tmp_path: Path, request_bytes: bytes
) -> None:
    async with gateway(tmp_path) as run, peer(run, request_bytes) as device:
        head = await device.head()
        assert head[9:12] in (b"400", b"426"), head
        await device.closed()
        assert run.gateway.registry.get(DEVICE) is None


async def test_a_device_without_a_valid_token_is_refused_with_403(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    request = handshake(Authorization="Bearer wrong")
    async with gateway(tmp_path) as run, peer(run, request) as device:
        assert (await device.head()).startswith(b"HTTP/1.1 403")
        await device.closed()
    assert any("refused device WebSocket from 127.0.0.1:" in r.message for r in caplog.records)


async def test_a_close_mid_frame_ends_the_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with gateway(tmp_path) as run:
        registry = run.gateway.registry
        gone = asyncio.Event()
        disconnect = registry.disconnect

        def disconnected(device_id: str, session: Any) -> None:
            disconnect(device_id, session)
            gone.set()

        monkeypatch.setattr(registry, "disconnect", disconnected)
        async with accepted(run) as device:
            await device.send(frame(TEXT, HELLO))
            assert (await device.message())["type"] == "hello"
            assert _online(run, DEVICE)
            await device.send(frame(TEXT, HELLO)[:10])  # half a frame, then gone
        async with asyncio.timeout(bound(5)):
            await gone.wait()
        assert not _online(run, DEVICE)


def _online(run: Running, device_id: str) -> bool:
    device = run.gateway.registry.get(device_id)
    return device is not None and device.online


async def _called(run: Running, device_id: str) -> int:
    """Call a tool of ``device_id`` over its connection; how many calls answered."""
    device = run.gateway.registry.get(device_id)
    assert device is not None and device.session is not None
    result = await device.session.call("self.lamp.get_state", {})
    return 0 if result.get("isError") else 1


async def test_a_device_silent_after_its_handshake_is_closed_when_discovery_gives_up(
    tmp_path: Path,
) -> None:
    """No hello, no answer: the gateway discovers anyway, then closes (1000) and forgets it."""
    async with gateway(tmp_path, hello_timeout=0.05, discovery_timeout=0.2) as run:
        async with accepted(run) as device:
            initialize = await device.message()
            assert initialize["payload"]["method"] == "initialize"
            opcode, payload = await device.frame()
            assert (opcode, payload[:2]) == (CLOSE, struct.pack("!H", 1000))
            await device.send(frame(CLOSE, payload[:2]))
            await device.closed()
        assert not _online(run, DEVICE)


async def test_a_device_that_never_reads_holds_its_calls_not_the_gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calls to a device whose socket is full wait (nothing half written, nothing buffered
    without bound), another device is served meanwhile, and they fail once it goes."""
    paused = asyncio.Event()
    pause = DeviceSocket.pause_writing

    def pausing(self: DeviceSocket) -> None:
        pause(self)
        paused.set()

    monkeypatch.setattr(DeviceSocket, "pause_writing", pausing)
    limits = {"max_message_bytes": 1 << 20, "call_max_in_flight": 16}
    async with gateway(tmp_path, **limits) as run, listed_device(run) as other:
        async with accepted(run, receive_buffer=1 << 16) as device:
            await device.send(frame(TEXT, HELLO))
            assert (await device.message())["type"] == "hello"
            for result in ({"protocolVersion": "2024-11-05", "capabilities": {}}, {"tools": []}):
                request = (await device.message())["payload"]  # initialize, tools/list
                reply = {"jsonrpc": "2.0", "id": request["id"], "result": result}
                envelope = {"session_id": "", "type": "mcp", "payload": reply}
                await device.send(frame(TEXT, json.dumps(envelope).encode()))
            stuck = run.gateway.registry.get(DEVICE)
            assert stuck is not None and stuck.session is not None
            session, big = stuck.session, {"pad": "x" * 900_000}  # 16 of them: over the buffers
            calls = [asyncio.create_task(session.call("self.anything", big)) for _ in range(16)]
            async with asyncio.timeout(bound(10)):
                await paused.wait()  # the socket is full: the device reads nothing
            assert await _called(run, other.device_id) == 1
            assert not any(call.done() for call in calls)
        async with asyncio.timeout(bound(10)):
            results = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(r, DeviceUnavailable) for r in results), results


async def test_a_calls_answer_wakes_its_caller_on_the_next_loop_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer's frame settles the call in the turn it is read (no task of the connection
    woken in between): the caller runs in the very next turn."""
    loop = asyncio.get_running_loop()
    turn, arrived = [0], [-1]
    run_once = loop._run_once  # type: ignore[attr-defined]

    def counting() -> None:
        turn[0] += 1
        run_once()

    data_received = DeviceSocket.data_received

    def received(self: DeviceSocket, data: bytes) -> None:
        arrived[0] = turn[0]
        data_received(self, data)

    async with gateway(tmp_path) as run, listed_device(run) as dev:
        device = run.gateway.registry.get(dev.device_id)
        assert device is not None and device.session is not None
        monkeypatch.setattr(DeviceSocket, "data_received", received)
        monkeypatch.setattr(loop, "_run_once", counting)
        for _ in range(5):
            await device.session.call("self.lamp.get_state", {})
            assert turn[0] - arrived[0] == 1


async def test_a_trusted_proxy_names_the_device_address_as_uvicorn_would(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Behind a reverse proxy on loopback (uvicorn's default trust), the refusal names the
    address in ``X-Forwarded-For``, as through uvicorn's proxy-headers middleware."""
    request = handshake(Authorization="Bearer wrong", **{"X-Forwarded-For": "192.0.2.7"})
    async with gateway(tmp_path) as run, peer(run, request) as device:
        assert (await device.head()).startswith(b"HTTP/1.1 403")
        await device.closed()
    assert any("refused device WebSocket from 192.0.2.7:" in r.message for r in caplog.records)
