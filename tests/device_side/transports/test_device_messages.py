"""A device WebSocket's messages handed to its connection (``DeviceMessages``): what a failure
in taking one does, on a real gateway with real WebSocket clients, and on a bare listener."""

from __future__ import annotations

import logging
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from gateway.device_side.transports import device_socket, websocket
from gateway.device_side.transports.device_socket import DeviceSocket
from gateway.device_side.transports.websocket import DeviceSockets
from tests.conftest import gateway
from tests.device_side.transports.test_device_socket import CLOSE, TEXT, Peer, frame
from tests.device_side.transports.test_device_socket_wire import HANDSHAKE
from tests.e2e.helpers import fail_catalogue_of, join_listing_no_tools, listed_device
from tests.net.test_limits import LIMITS, opened, serving

pytestmark = pytest.mark.anyio

BROKEN = "02:00:00:00:00:41"  # the device whose tool list the gateway fails to handle


async def test_a_failure_handling_one_devices_message_closes_it_with_1011_and_spares_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The registry fails on one device's tool list (handled in the loop turn its frame is
    read): that device's session ends as on any session error (logged once with its id, closed
    with 1011, offline), asyncio's transport is never failed, and another device stays served."""
    fail_catalogue_of(monkeypatch, BROKEN)
    async with gateway(tmp_path) as run, listed_device(run) as other:
        url = run.device_url
        assert await join_listing_no_tools(url, BROKEN) == 1011
        device = run.gateway.registry.get(BROKEN)
        assert device is not None and not device.online and device.session is None
        other_device = run.gateway.registry.get(other.device_id)
        assert other_device is not None and other_device.session is not None
        result = await other_device.session.call("self.lamp.get_state", {})
        assert not result.get("isError"), result
    failures = [r for r in caplog.records if r.exc_info and r.levelno >= logging.ERROR]
    assert [(r.name, r.getMessage()) for r in failures] == [
        (websocket.__name__, f"WebSocket device {BROKEN}: session failed")
    ]
    assert "the registry broke on this device" in str(failures[0].exc_info)
    assert not any("data_received" in r.getMessage() for r in caplog.records)


def _broken(text: str) -> None:
    raise RuntimeError(f"cannot take {text}")


async def _takes_late(socket: DeviceSocket) -> None:
    """Accept, pull one message, then take the rest as they come: what came meanwhile first."""
    if socket.accept():
        assert await anext(aiter(socket)) == "first"  # "second" came in the same read
        await socket.deliver(_broken)


async def _fails_once_accepted(socket: DeviceSocket) -> None:
    if socket.accept():
        _broken("nothing")


@pytest.mark.parametrize("endpoint", [_takes_late, _fails_once_accepted])
async def test_a_session_that_fails_once_accepted_closes_its_websocket_with_1011(
    endpoint: Callable[[DeviceSocket], Awaitable[None]], caplog: pytest.LogCaptureFixture
) -> None:
    """Taking a message that waited for the session, or anything else the session does once it
    accepted: the failure is logged once and the device gets 1011, not a bare TCP close."""
    async with serving(LIMITS, DeviceSockets({"/device"}, endpoint)) as (port, guard):
        reader, writer = await opened(port, HANDSHAKE)
        device = Peer(reader, writer)
        assert (await device.head()).startswith(b"HTTP/1.1 101")
        await device.send(frame(TEXT, b"first") + frame(TEXT, b"second"))  # one read
        opcode, reason = await device.frame()
        assert (opcode, reason) == (CLOSE, struct.pack("!H", 1011) + b"internal error")
        await device.closed()
        writer.close()
        await guard.until(0)
    failures = [r for r in caplog.records if r.exc_info]
    assert [(r.name, r.getMessage()[:21]) for r in failures] == [
        (device_socket.__name__, "device WebSocket from")
    ]
    assert "127.0.0.1" in failures[0].getMessage()
