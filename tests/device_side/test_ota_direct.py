"""The OTA check-in answered below ASGI: the same bytes as the ASGI route, and no scope or task.

Each request goes to the gateway's device listener (a whole check-in in one packet takes the
direct path there) and to a second listener on the same gateway's device app that answers
nothing below ASGI (uvicorn's h11 path, Starlette's route): the two answers must match, for
hostile requests as for stock ones.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import h11
import pytest

from gateway.app import Running
from gateway.config import ListenAddress
from gateway.net import upgrade
from gateway.net.limits import Guard, listener_limits
from gateway.net.listeners import bind, listening, uvicorn_config
from gateway.net.upgrade import DirectUpgrade
from tests.conftest import bound, gateway
from tests.net.test_upgrade import Reads

pytestmark = pytest.mark.anyio

DEVICE = "02:00:00:00:00:01"
BODY = json.dumps({
    "version": 2, "mac_address": DEVICE, "uuid": "c-1", "chip_model_name": "esp32s3",
    "application": {"name": "xiaozhi", "version": "2.4.2"},
    "board": {"type": "bread-compact-wifi", "mac": DEVICE},
}).encode()  # fmt: skip
EMBEDDED = {"mqtt_listen": ListenAddress("127.0.0.1", 0)}


def post(
    body: bytes = BODY,
    device: str = DEVICE,
    client: str = "c-1",
    *,
    extra: str = "",
    close: bool = True,
    target: str = "/xiaozhi/ota/",
) -> bytes:
    """A stock check-in (docs/protocol.md §3), the same Host on both listeners."""
    head = (
        f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1:8765\r\nActivation-Version: 1\r\n"
        f"Device-Id: {device}\r\nClient-Id: {client}\r\nUser-Agent: bread-compact-wifi/2.4.2\r\n"
        f"Content-Type: application/json\r\n{extra}"
        f"Content-Length: {len(body)}\r\n" + ("Connection: close\r\n" if close else "") + "\r\n"
    )
    return head.encode() + body


@asynccontextmanager
async def asgi_path(run: Running) -> AsyncIterator[int]:
    """The gateway's device app on a listener of its own that serves nothing below ASGI."""
    config = run.gateway.config
    guard = Guard(listener_limits(config, "device"))
    app = uvicorn_config(run.gateway.device_app, config, guard)
    served = [("asgi", app, bind(ListenAddress("127.0.0.1", 0)))]
    async with listening(served) as ports:
        yield ports[0]


async def exchange(
    port: int, *pieces: bytes, reads: Reads | None = None, responses: int = 1
) -> bytes:
    """Send ``pieces`` (each read apart by the listener when ``reads`` watches it); return
    the next ``responses`` final responses, joined by NUL (one without a length: what came
    until the server closed)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        async with asyncio.timeout(bound(10)):
            for index, piece in enumerate(pieces):
                while reads is not None and len(reads) < index:  # the piece before, alone
                    reads.arrived.clear()
                    await reads.arrived.wait()
                writer.write(piece)
                await writer.drain()
            received = []
            while len(received) < responses:
                head = await reader.readuntil(b"\r\n\r\n")
                if head.startswith(b"HTTP/1.1 100 "):
                    continue  # interim: the final response follows
                length = head.lower().partition(b"\r\ncontent-length: ")[2].split(b"\r")[0]
                body = await (reader.readexactly(int(length)) if length else reader.read(-1))
                received.append(head + body)
            return b"\0".join(received)
    finally:
        writer.close()


def normalized(raw: bytes) -> list[tuple[list[bytes], Any]]:
    """Responses (as ``exchange`` joins them) without what moves from one second to the next
    (the date, the clock sent to the device, how long to wait after a 429)."""
    return [_normalized(response) for response in raw.split(b"\0")]


def _normalized(raw: bytes) -> tuple[list[bytes], Any]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    data: Any = body
    try:
        data = json.loads(body)
    except ValueError:
        pass
    moving = [b"date: "]
    if isinstance(data, dict):
        data.get("server_time", {}).pop("timestamp", None)
        if data.pop("retry_after", None) is not None:  # a float: its length moves too
            moving.append(b"content-length: ")
    return [line for line in lines if not line.startswith(tuple(moving))], data


class Work:
    """What the listeners did for the requests in a ``counted`` block."""

    def __init__(self) -> None:
        self.reads = Reads()  # every packet the listeners' HTTP protocol read
        self.h11_reads = Reads()
        self.asgi_tasks = 0  # uvicorn's RequestResponseCycle.run_asgi
        self.scopes = 0  # requests that reached the device app
        self.heads = 0  # direct POSTs' heads parsed


@contextmanager
def counted(run: Running, monkeypatch: pytest.MonkeyPatch) -> Iterator[Work]:
    work = Work()
    receive = h11.Connection.receive_data

    def read(self: h11.Connection, data: bytes) -> None:
        work.h11_reads.append(bytes(data))
        work.h11_reads.arrived.set()
        receive(self, data)

    monkeypatch.setattr(h11.Connection, "receive_data", read)
    received = DirectUpgrade.data_received

    def packet(self: DirectUpgrade, data: bytes) -> None:
        work.reads.append(bytes(data))
        work.reads.arrived.set()
        received(self, data)

    monkeypatch.setattr(DirectUpgrade, "data_received", packet)
    parse = upgrade.direct_post

    def head(data: bytes, requests: Any) -> Any:
        work.heads += 1
        return parse(data, requests)

    monkeypatch.setattr(upgrade, "direct_post", head)
    front = run.gateway.device_app
    app = front.app

    async def scoped(scope: Any, receive: Any, send: Any) -> None:
        work.scopes += 1
        await app(scope, receive, send)

    monkeypatch.setattr(front, "app", scoped)
    loop = asyncio.get_running_loop()
    factory = loop.get_task_factory()

    def task(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kw: Any) -> Any:
        work.asgi_tasks += getattr(coro, "__qualname__", "") == "RequestResponseCycle.run_asgi"
        return asyncio.Task(coro, loop=loop, **kw)

    loop.set_task_factory(task)
    try:
        yield work
    finally:
        loop.set_task_factory(factory)


async def test_stock_check_ins_take_no_h11_no_scope_and_no_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted, not timed: whole check-ins cost no parse by h11, no ASGI scope, no task; a
    check-in whose body comes in a second packet takes the ASGI path (one of each)."""
    async with gateway(tmp_path, **EMBEDDED) as run:
        port = run.device_port
        with counted(run, monkeypatch) as work:
            for n in range(20):
                device = f"02:00:00:00:01:{n:02x}"
                reply = await exchange(
                    port, post(BODY.replace(DEVICE.encode(), device.encode()), device)
                )
                assert reply.startswith(b"HTTP/1.1 200 OK\r\ndate: "), reply
                assert json.loads(reply.partition(b"\r\n\r\n")[2])["mqtt"]["client_id"] == device
            assert (work.h11_reads, work.scopes, work.asgi_tasks) == ([], 0, 0)
            assert run.gateway.registry.get("02:00:00:00:01:13") is not None
            assert len(work.reads) == 20


@pytest.mark.parametrize(
    ("name", "pieces", "scopes"),
    [
        ("body in pieces", [post()[:-10], post()[-10:]], 0),  # as firmware may write it
        ("body in bytes", [post()[: -len(BODY)], *(bytes([b]) for b in BODY)], 0),
        ("head in pieces", [post()[:40], post()[40:]], 1),
        ("bytes after the body", [post(close=False)[:-10], post(close=False)[-10:] + post()], 2),
    ],
)
async def test_a_check_in_in_pieces_is_answered_as_the_asgi_route_answers_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, pieces: list[bytes], scopes: int
) -> None:
    """A head whole in the first packet waits there for its body; a head in pieces, or more
    bytes than the body, takes h11 (counted: the ASGI scopes made)."""
    responses = 2 if name == "bytes after the body" else 1
    async with gateway(tmp_path, **EMBEDDED) as run, asgi_path(run) as asgi:
        await exchange(asgi, post())  # the device is known before: both answer alike
        with counted(run, monkeypatch) as work:
            direct = await exchange(run.device_port, *pieces, reads=work.reads, responses=responses)
            assert work.scopes == scopes
            assert work.heads == 1  # the first packet only, not once per piece
            work.reads.clear()
            routed = await exchange(asgi, *pieces, reads=work.reads, responses=responses)
        assert direct.startswith(b"HTTP/1.1 200 OK\r\n")
        assert normalized(direct) == normalized(routed), (direct, routed)


CHUNKED = b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)
HOSTILE = {
    "stock": post(),
    "kept alive": post(close=False),
    "query string": post(target="/xiaozhi/ota/?x=1"),
    "no trailing slash": post(target="/xiaozhi/ota"),
    "broken JSON, Device-Id header": post(b'{"mac_address": "x", "board": {'),
    "no Device-Id at all": post(b"not json", device=""),
    "malformed Device-Id": post(device="aa-bb-cc-dd-ee-ff"),
    "another Client-Id": post(client="impostor"),
    "body too large": post(b"x" * (64 * 1024 + 1)),
    "chunked": post(CHUNKED).replace(
        b"Content-Length: %d\r\n" % len(CHUNKED), b"Transfer-Encoding: chunked\r\n"
    ),
    "Expect": post(extra="Expect: 100-continue\r\n"),
    "proxied": post(extra="X-Forwarded-For: 10.0.0.9\r\n"),
    "not a header name": post(extra="Bad Header: x\r\n"),
    "a control character": post(extra="X-Note: a\x01b\r\n"),
    "no Host": post().replace(b"Host: 127.0.0.1:8765\r\n", b""),
    "two Hosts": post(extra="Host: elsewhere\r\n"),
    "two lengths": post(extra="Content-Length: 3\r\n"),
    "HTTP/1.0": post().replace(b"HTTP/1.1", b"HTTP/1.0", 1),
    "pipelined": post(close=False) + post(),
    "GET": b"GET /xiaozhi/ota/ HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
async def test_the_direct_path_answers_as_the_asgi_route(tmp_path: Path, name: str) -> None:
    """Byte for byte but the date and the clock: status, headers (server, length, type,
    connection), body; for a refusal and for h11's own errors as for a reply."""
    request = HOSTILE[name]
    async with gateway(tmp_path, **EMBEDDED) as run, asgi_path(run) as asgi:
        await exchange(asgi, post())  # the device is known before: both answer alike
        responses = 2 if name == "pipelined" else 1
        for _ in range(2):  # each path once first: a second answer is no different
            direct = await exchange(run.device_port, request, responses=responses)
            routed = await exchange(asgi, request, responses=responses)
            assert normalized(direct) == normalized(routed), (direct, routed)


async def test_a_kept_alive_connection_serves_its_next_request_through_h11(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path, **EMBEDDED) as run:
        reader, writer = await asyncio.open_connection("127.0.0.1", run.device_port)
        try:
            async with asyncio.timeout(bound(10)):
                for _ in range(2):
                    writer.write(post(close=False))
                    head = await reader.readuntil(b"\r\n\r\n")
                    assert head.startswith(b"HTTP/1.1 200 OK") and b"onnection" not in head
                    length = int(head.lower().partition(b"content-length: ")[2].split(b"\r")[0])
                    assert "mqtt" in json.loads(await reader.readexactly(length))
        finally:
            writer.close()


async def test_one_rate_limit_for_both_paths(tmp_path: Path) -> None:
    """Loopback is not exempt here: the burst is spent on the direct path, and the ASGI route
    refuses the next check-in from the same address as the direct path would (429)."""
    limits = {"limits_exempt_addresses": (), "limits_ota_burst": 2, **EMBEDDED}
    async with gateway(tmp_path, **limits) as run, asgi_path(run) as asgi:
        for _ in range(2):
            assert (await exchange(run.device_port, post())).startswith(b"HTTP/1.1 200")
        routed = await exchange(asgi, post())
        direct = await exchange(run.device_port, post())
        assert routed.startswith(b"HTTP/1.1 429") and b"retry-after: " in routed
        assert normalized(direct) == normalized(routed)


async def test_a_failing_handler_is_answered_500_and_logged_as_on_the_asgi_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async with gateway(tmp_path, **EMBEDDED) as run, asgi_path(run) as asgi:

        def broken(*args: object, **kwargs: object) -> None:
            raise OSError("disk full")

        monkeypatch.setattr(run.gateway.registry, "register", broken)
        with caplog.at_level(logging.ERROR, "uvicorn.error"):
            direct = await exchange(run.device_port, post(close=False))
            routed = await exchange(asgi, post(close=False))
        assert direct.startswith(b"HTTP/1.1 500") and normalized(direct) == normalized(routed)
        failures = [r for r in caplog.records if r.message.startswith("Exception in ASGI")]
        assert len(failures) == 2 and all(r.exc_info for r in failures)


async def test_a_check_in_keeps_the_listener_deadlines(tmp_path: Path) -> None:
    """A head whole in the first packet stops the handshake deadline, as h11's path does; its
    connection, which never authenticates, is closed at the authentication deadline if the
    body never comes. A head that never ends is closed at the handshake deadline."""
    deadlines = {"limits_handshake_timeout": 0.3, "limits_auth_timeout": 1.0}
    async with gateway(tmp_path, **deadlines, **EMBEDDED) as run:
        refused = run.gateway.metrics.refusals["device"]
        opened = [await asyncio.open_connection("127.0.0.1", run.device_port) for _ in range(2)]
        for (_, writer), piece in zip(opened, (post()[:-10], post()[:40]), strict=True):
            writer.write(piece)
        for reader, writer in opened:
            async with asyncio.timeout(bound(10)):
                assert await reader.read(-1) == b""  # closed, unanswered
            writer.close()
        assert refused() == {"auth": 1, "handshake": 1}
