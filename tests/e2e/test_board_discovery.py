"""Boards found over mDNS (loopback multicast): pending until approved, let go when silent."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from zeroconf import IPVersion
from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

from gateway.device_side.boards import board_id
from gateway.device_side.boards.discovery import board_url_of
from gateway.devices.device import PENDING
from tests.conftest import bound, gateway
from tests.e2e.boards import BoardState, python_board, served
from tests.e2e.helpers import has_tools, until

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


def test_urls_from_what_boards_really_announce() -> None:
    """ESP-Claw's TXT endpoint (no slash), mcpd's path and whole-URL endpoint, or nothing."""
    assert board_url_of("10.0.0.5", 18791, {b"endpoint": b"mcp_server"}) == (
        "http://10.0.0.5:18791/mcp_server"
    )
    mcpd = {b"path": b"/mcp", b"endpoint": b"http://10.9.9.9:80/mcp"}
    assert board_url_of("10.0.0.6", 80, mcpd) == "http://10.0.0.6:80/mcp"
    assert board_url_of("10.0.0.7", 8080, {b"endpoint": b"http://evil.example/x"}) == (
        "http://10.0.0.7:8080/x"  # a TXT URL's host is never used: the announced address is
    )
    assert board_url_of("10.0.0.8", 8080, {}) == "http://10.0.0.8:8080/mcp"


async def test_announced_board_is_pending_then_approved_then_let_go(tmp_path: Path) -> None:
    """Announced: pending, nothing exposed; approved: listed; unannounced: offline after grace."""
    async with served(python_board("claw", BoardState()).streamable_http_app()) as base:
        port = int(base.rsplit(":", 1)[1])
        url = f"http://127.0.0.1:{port}/mcp"
        config = {"boards_discover": True, "boards_discover_interfaces": ("127.0.0.1",),
                  "boards_discover_grace": bound(0.5)}  # fmt: skip
        publisher = AsyncZeroconf(interfaces=["127.0.0.1"], ip_version=IPVersion.V4Only)
        info = AsyncServiceInfo(
            "_mcp._tcp.local.", "ESP-Claw._mcp._tcp.local.", port=port,
            addresses=[socket.inet_aton("127.0.0.1")], properties={"endpoint": "mcp"},
            server="esp-claw.local.",
        )  # fmt: skip
        try:
            async with gateway(tmp_path, **config) as run:
                registry = run.gateway.registry

                def listed_pending() -> bool:
                    device = registry.get(board_id(url))
                    return (
                        device is not None and device.online and device.record.catalogue is not None
                    )

                async with registry.device_changes() as changes:
                    await publisher.async_register_service(info)
                    await until(changes, listed_pending)
                    device = registry.get(board_id(url))
                    assert device is not None and device.record.state == PENDING
                    async with Client(run.mcp_url, mode="legacy") as client:
                        before = [t.name for t in (await client.list_tools()).tools]
                    assert not any("greet" in name for name in before)  # nothing exposed
                    async with httpx2.AsyncClient() as http:
                        approved = await http.post(
                            f"http://127.0.0.1:{run.host_port}/api/devices/approve",
                            json={"device": board_id(url)},
                        )
                    assert approved.status_code == 200
                    await until(changes, has_tools(run, board_id(url)))
                    async with Client(run.mcp_url, mode="legacy") as client:
                        after = [t.name for t in (await client.list_tools()).tools]
                        greet = next(name for name in after if name.endswith("_greet"))
                        greeting = await client.call_tool(greet, {"who": "kim"})
                    await publisher.async_unregister_service(info)
                    await until(changes, lambda: not registry.get(board_id(url)).online)  # type: ignore[union-attr]
                    assert greet in [t.name for t in registry.exposed_tools()]  # offline memory
        finally:
            await publisher.async_close()
    assert greet.startswith("claw")  # named after the board's serverInfo
    assert greeting.content[0].text == "hello kim from claw"
