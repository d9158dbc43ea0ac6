"""Listener limits on a real gateway: slow-loris, connection caps, OTA and enroll rates, and
a 10 MB MQTT publish, each while a good device keeps working."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client

from gateway.app import Running
from gateway.config import ListenAddress
from gateway.net.public import OTA_PATH
from gateway.simulator import SimulatedDevice
from tests.conftest import DEVICE_TOKEN, bound, gateway
from tests.device_side.broker.raw import logged_in, publish_head
from tests.device_side.test_ota import STOCK_BODY, STOCK_HEADERS
from tests.e2e.helpers import has_tools, listed_device, until
from tests.mqtt_helpers import MqttDevice
from tests.net.test_limits import closed_by_server, opened

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

# A WebSocket upgrade whose headers never end, and a connection that says nothing at all.
SLOW_UPGRADE = b"GET /xiaozhi/v1/ HTTP/1.1\r\nHost: gateway\r\nUpgrade: websocket\r\n"
COUNTED: dict[str, Any] = {"limits_exempt_addresses": ()}  # loopback counts like the LAN


async def test_200_slow_loris_sockets_are_closed_by_the_deadline_while_a_device_connects(
    tmp_path: Path,
) -> None:
    """They hold their sockets; a device connects and is listed meanwhile; the deadline ends all."""
    deadline = bound(1.5)
    async with gateway(tmp_path, limits_handshake_timeout=deadline) as run:
        loop = asyncio.get_running_loop()
        start = loop.time()
        slow = [await opened(run.device_port, SLOW_UPGRADE if n % 2 else b"") for n in range(200)]
        async with (
            run.gateway.registry.changes() as changes,
            SimulatedDevice(run.device_url, DEVICE_TOKEN) as device,  # handshake and hello done
        ):
            held = [not reader.at_eof() for reader, _ in slow]
            await until(changes, has_tools(run, device.device_id))
        assert held == [True] * 200  # the device got in while all 200 held their sockets
        sent = await asyncio.gather(*(closed_by_server(reader) for reader, _ in slow))
        assert sent == [b""] * 200  # closed, not answered
        assert loop.time() - start >= deadline * 0.9
        for _, writer in slow:
            writer.close()


async def test_past_the_device_listener_cap_connections_are_refused_at_once(
    tmp_path: Path,
) -> None:
    """device_connections open (a device among them): the next is closed before any reply."""
    async with gateway(tmp_path, limits_device_connections=5) as run:
        held = [await opened(run.device_port) for _ in range(4)]
        async with listed_device(run):
            request = b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n"
            extra, writer = await opened(run.device_port, request)
            assert await closed_by_server(extra, 2) == b""
            writer.close()
            assert has_tools(run, "02:00:00:00:00:01")()
        for _, writer in held:
            writer.close()


async def test_one_address_may_hold_only_so_many_unauthenticated_connections(
    tmp_path: Path,
) -> None:
    """per_address partial requests from one address: the next is refused; devices don't count."""
    async with gateway(tmp_path, limits_per_address=3, **COUNTED) as run:
        async with listed_device(run):  # accepted: it no longer counts against its address
            held = [await opened(run.device_port, SLOW_UPGRADE) for _ in range(3)]
            extra, writer = await opened(run.device_port)
            assert await closed_by_server(extra, 2) == b""
            writer.close()
            assert [reader.at_eof() for reader, _ in held] == [False] * 3
            for _, held_writer in held:
                held_writer.close()
            assert has_tools(run, "02:00:00:00:00:01")()


async def test_ota_check_ins_over_the_rate_get_429_then_recover(tmp_path: Path) -> None:
    """ota_burst check-ins pass; the next gets 429 with Retry-After; after that wait, 200."""
    limits = {"limits_ota_burst": 2, "limits_ota_per_minute": 600, **COUNTED}  # 1 per 0.1 s
    async with gateway(tmp_path, **limits) as run, httpx2.AsyncClient() as http:
        url = f"http://127.0.0.1:{run.device_port}{OTA_PATH}"

        async def check_in() -> httpx2.Response:
            return await http.post(url, headers=STOCK_HEADERS, json=STOCK_BODY)

        assert [(await check_in()).status_code for _ in range(2)] == [200, 200]
        refused = await check_in()
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        body = refused.json()
        assert "too many OTA check-ins" in body["error"] and 0 < body["retry_after"] <= 0.1
        await asyncio.sleep(body["retry_after"])  # what the reply asks of the device
        assert (await check_in()).status_code == 200


async def test_enroll_requests_over_the_rate_get_429(tmp_path: Path) -> None:
    """The host listener's /api/enroll has its own per-address bucket."""
    async with gateway(tmp_path, limits_enroll_burst=1, **COUNTED) as run:
        async with httpx2.AsyncClient() as http:
            url = f"http://127.0.0.1:{run.host_port}/api/enroll"
            first = await http.post(url, json={"name": "kitchen"})
            second = await http.post(url, json={"name": "hall"})
    assert first.status_code == 200 and first.json()["token"]
    assert second.status_code == 429 and int(second.headers["retry-after"]) == 6
    assert "too many enroll requests" in second.json()["error"]


def rss_bytes() -> int:
    """This process's resident memory (the gateway runs in the test process)."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


async def publish_10_mb(port: int, device_id: str) -> None:
    """Log in as a device and publish 10 MB, 64 KiB at a time, until the broker hangs up."""
    reader, writer = await logged_in(port, device_id, DEVICE_TOKEN)
    chunk, size = b"x" * 65536, 10 * 1024 * 1024
    writer.write(publish_head(f"xiaozhi/{device_id}/up", size))
    with contextlib.suppress(ConnectionResetError, BrokenPipeError):
        for _ in range(size // len(chunk)):
            writer.write(chunk)
            await writer.drain()
    assert await closed_by_server(reader) == b""
    writer.close()


async def test_a_10_mb_mqtt_publish_is_refused_and_memory_barely_moves(tmp_path: Path) -> None:
    """The embedded broker drops the sender before the body; a device on it keeps working."""
    embedded = {"mqtt_listen": ListenAddress("127.0.0.1", 0)}
    async with gateway(tmp_path, **embedded) as run:
        broker = run.gateway.broker
        assert broker is not None
        good = MqttDevice("127.0.0.1", broker.port, "aa:bb:cc:dd:ee:02", DEVICE_TOKEN, stock=False)
        async with good, run.gateway.registry.changes() as changes:
            await until(changes, has_tools(run, good.device_id))
            before = rss_bytes()
            await publish_10_mb(broker.port, "aa:bb:cc:dd:ee:03")
            grown = rss_bytes() - before
            assert grown < 5 * 1024 * 1024, f"RSS grew by {grown} bytes"
            assert await call_lamp(run, good.device_id)
        assert good.calls == ["self.lamp.turn_on"]


async def call_lamp(run: Running, device_id: str) -> bool:
    """Turn the device's lamp on over MCP; True when the call succeeded."""
    [name] = [
        t.name
        for t in run.gateway.registry.exposed_tools()
        if t.device.device_id == device_id and t.spec.name == "self.lamp.turn_on"
    ]
    async with Client(run.mcp_url, mode="legacy") as client:
        result = await client.call_tool(name, {})
    return not result.is_error
