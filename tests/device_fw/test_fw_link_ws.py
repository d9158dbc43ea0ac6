"""The WebSocket link (fw_link_ws): stock headers and hello, server hello, keepalive."""

from __future__ import annotations

import asyncio
import json

import pytest

from device_fw import fw_link_ws
from device_fw.fw_envelope import HELLO
from device_fw.fw_link_ws import HelloError, WsLink
from tests.conftest import bound
from tests.simulator.helpers import SERVER_HELLO, mini_gateway

pytestmark = pytest.mark.anyio


async def test_open_sends_stock_headers_and_hello_and_takes_the_session() -> None:
    """Bearer token, Client-Id, lower-case Device-Id, Protocol-Version 1; hello; session id."""
    async with mini_gateway() as gw:
        link = WsLink(gw.url, "tok", "AA:BB:CC:DD:EE:FF", "c1d2")
        await link.open()
        assert await gw.recv() == HELLO
        await link.close()
    headers = gw.requests[0].headers
    assert headers["Authorization"] == "Bearer tok"
    assert (headers["Device-Id"], headers["Client-Id"]) == ("aa:bb:cc:dd:ee:ff", "c1d2")
    assert headers["Protocol-Version"] == "1"
    assert link.session_id == "sess-1"


async def test_messages_before_the_server_hello_are_kept_and_later_hellos_update_the_session() -> (
    None
):
    """An MCP frame that beats the server hello is handed over first; a new hello's session
    id replaces the old one."""
    async with mini_gateway(hello=None) as gw:
        link = WsLink(gw.url, None, "aa", "c")
        opening = asyncio.create_task(link.open())
        await gw.recv()
        await gw.send_mcp({"jsonrpc": "2.0", "id": 1, "method": "ping"})
        await gw.send(SERVER_HELLO)
        async with asyncio.timeout(bound(5)):
            await opening
            early = await link.recv()
            await gw.send({**SERVER_HELLO, "session_id": "sess-2"})
            await gw.send_mcp({"jsonrpc": "2.0", "id": 2, "method": "ping"})
            later = await link.recv()
        await link.close()
    assert "Authorization" not in gw.requests[0].headers
    assert early is not None and early["payload"]["id"] == 1
    assert later is not None and later["payload"]["id"] == 2 and link.session_id == "sess-2"


async def test_no_server_hello_in_time_is_a_hello_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a server hello within HELLO_TIMEOUT, open() fails and drops the socket."""
    monkeypatch.setattr(fw_link_ws, "HELLO_TIMEOUT", 0.2)
    async with mini_gateway(hello=None) as gw:
        link = WsLink(gw.url, "t", "aa", "c")
        with pytest.raises(HelloError, match="no server hello within"):
            await link.open()
        assert await gw.wait_ended() is not None


async def test_keepalive_pings_and_a_silent_gateway_is_dropped() -> None:
    """With a ping interval the link pings; when the gateway stops answering, recv() ends."""
    async with mini_gateway() as gw:
        link = WsLink(gw.url, "t", "aa", "c", ping_interval=0.05)
        await link.open()
        connection = await gw.next_connection()
        async with asyncio.timeout(bound(5)):
            assert await connection.ping() is not None  # the link answers pings too
            connection.transport.pause_reading()  # the gateway goes deaf: no pongs, no frames
            assert await link.recv() is None
        connection.transport.abort()  # else the server waits out its closing handshake
    assert link.ws is not None and link.ws.closed


async def test_send_before_open_is_an_os_error() -> None:
    """A link that was never opened refuses to send."""
    with pytest.raises(OSError):
        await WsLink("ws://127.0.0.1:9/", "t", "aa", "c").send(json.dumps({}))
