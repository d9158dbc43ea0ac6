"""A stock MQTT device keeps its voice server through the gateway (issue 19, MQTT half).

Real parts throughout: the gateway with its embedded broker, the device emulator of
tests/mqtt_helpers.py (stock: never subscribes, QoS 0, hello with transport udp), a real
mosquitto as the upstream's broker with the voice server's client on it (tests/upstream_mqtt.py),
and MCP hosts on the SDK's client.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client

from gateway.app import Running
from gateway.config import DeviceOptions, ListenAddress
from gateway.device_side.upstream.mqtt_settings import parse_upstream_mqtt
from gateway.device_side.upstream.settings import SERVER_MESSAGE_BYTES
from gateway.device_side.upstream.tap import GATEWAY_IDS
from gateway.simulator import DeviceMcpServer, default_tools
from tests.conftest import bound, gateway
from tests.device_side.test_ota import STOCK_HEADERS
from tests.e2e.helpers import has_tools, until
from tests.e2e.test_mqtt import EMBEDDED, ota_check_in, stock_device, tool_name, wait_listed
from tests.mqtt_helpers import Mosquitto, MqttDevice, stock_accepts_hello
from tests.ports import outside_ephemeral
from tests.upstream_mqtt import UpstreamMqttServer, upstream_broker
from tests.upstream_server import UpstreamServer

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

STOCK = "aa:bb:cc:dd:ee:ff"
OTHER = "aa:bb:cc:dd:ee:02"


@dataclass
class VoiceServer:
    """A voice server's OTA (tests/upstream_server.py) and MQTT side, for one device."""

    ota: UpstreamServer
    broker: Mosquitto
    mqtt: UpstreamMqttServer


@asynccontextmanager
async def voice_server(workdir: Path, mac: str) -> AsyncIterator[VoiceServer]:
    """A voice server for the device ``mac`` (as the device names itself: upper case here)."""
    broker = await upstream_broker(workdir, mac)
    ota = UpstreamServer(offer="mqtt")
    ota.mqtt_endpoint = f"127.0.0.1:{broker.port}"
    ota.activated.add(mac)  # no activation code to show
    try:
        async with ota.running(), UpstreamMqttServer(broker, mac) as mqtt:
            yield VoiceServer(ota, broker, mqtt)
    finally:
        await broker.kill()


@asynccontextmanager
async def joined(run: Running, headers: dict[str, str]) -> AsyncIterator[MqttDevice]:
    """A stock device that checks in through the gateway and joins its broker, relayed."""
    device_id = headers["Device-Id"].lower()
    proxies = run.gateway.sessions.mqtt_proxies
    assert proxies is not None
    proxies.retry = (0.1, 0.5)
    reply = await ota_check_in(run, headers)  # forwarded to the upstream, rewritten for us
    ours = reply["mqtt"]  # the gateway's broker and login, none of the upstream's
    assert ours["publish_topic"] == f"xiaozhi/{device_id}/up" and "subscribe_topic" not in ours
    assert run.gateway.proxy is not None and run.gateway.proxy.mqtt is not None
    kept = run.gateway.proxy.mqtt.get(device_id)  # type: ignore[attr-defined]
    assert ours["client_id"] == device_id and ours["password"] != kept.password
    registry = run.gateway.registry
    async with (
        registry.device_changes() as changes,
        stock_device(reply, device_id=device_id) as device,
    ):
        async with asyncio.timeout(bound(10)):  # online: approved or not, its session runs
            while not registry.find(device_id).online:  # type: ignore[union-attr]
                await anext(aiter(changes))
        if registry.find(device_id).approved:  # type: ignore[union-attr]
            await wait_listed(run, device_id)
        relay = proxies.relay_of(device_id)
        assert relay is not None
        async with asyncio.timeout(bound(10)):  # as a device's server, once it is up
            await relay.upstream.connected.wait()
        yield device


@asynccontextmanager
async def proxied(
    tmp_path: Path, **overrides: Any
) -> AsyncIterator[tuple[Running, UpstreamMqttServer, Mosquitto, MqttDevice]]:
    """A gateway, an upstream for the stock device, and the device connected through both."""
    async with voice_server(tmp_path / "upstream", STOCK_HEADERS["Device-Id"]) as server:
        settings = {**EMBEDDED, "upstream_ota_url": server.ota.ota_url, **overrides}
        async with (
            gateway(tmp_path / "gw", **settings) as run,
            joined(run, STOCK_HEADERS) as device,
        ):
            kept = run.gateway.proxy.mqtt.get(STOCK)  # type: ignore[union-attr]
            assert kept == parse_upstream_mqtt(server.mqtt.mqtt_section(STOCK_HEADERS["Client-Id"]))
            yield run, server.mqtt, server.broker, device


def hello_bytes(device: MqttDevice) -> bytes:
    """The last hello reply the device received, byte for byte."""
    return [raw for raw in device.raw if json.loads(raw)["type"] == "hello"][-1]


def model_tools(device: MqttDevice) -> list[str]:
    """What the device lists to a server that does not ask for user-only tools."""
    return [t.name for t in device.mcp.tools if not t.user_only]


async def conversation(device: MqttDevice, server: UpstreamMqttServer) -> list[dict[str, Any]]:
    """Open a conversation; the tools the upstream listed once it initialized the device."""
    await device.hello()
    async with asyncio.timeout(bound(10)):
        return await server.tools.get()


async def test_the_upstream_hello_passes_byte_for_byte_and_audio_goes_direct(
    tmp_path: Path,
) -> None:
    async with proxied(tmp_path) as (run, server, _, device):
        hello = await device.hello()
        assert stock_accepts_hello(hello)
        assert hello_bytes(device) == server.hello_replies[-1]  # the upstream's own bytes
        async with asyncio.timeout(bound(10)):
            listed = await server.tools.get()  # initialize id 1, tools/list id 2: answered
        assert [t["name"] for t in listed] == model_tools(device)
        assert json.loads(server.received[0])["type"] == "hello"  # the device's, unchanged
        # The udp block names the upstream itself: audio never passes the gateway.
        udp = hello["udp"]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.sendto(b"\x01opus", (udp["server"], udp["port"]))
        async with asyncio.timeout(bound(5)):
            assert await server.udp.get() == b"\x01opus"
        # The gateway discovered the device itself with ids the upstream never sees.
        known = run.gateway.registry.find(STOCK)
        assert known is not None and known.online and known.upstream is not None
        assert known.upstream.server.startswith("mqtt://127.0.0.1:")
        assert known.upstream.state == "connected"  # what list_devices and the dashboard show
        ids = {json.loads(raw)["payload"].get("id") for raw in server.received[1:]}
        assert ids == {1, 2}


async def test_upstream_and_host_calls_interleave_and_each_gets_its_reply(
    tmp_path: Path,
) -> None:
    async with proxied(tmp_path) as (run, server, _, device):
        await conversation(device, server)
        lamp = tool_name(run, STOCK, "self.lamp.get_state")
        async with Client(run.mcp_url, mode="legacy") as host:
            upstream_calls = [server.call("self.lamp.get_state") for _ in range(5)]
            host_calls = [host.call_tool(lamp, {}) for _ in range(5)]
            results = await asyncio.gather(*upstream_calls, *host_calls)
        for reply in results[:5]:
            assert reply["id"] in range(1, 6) and "result" in reply  # exactly its own ids
        assert sorted(r["id"] for r in results[:5]) == [1, 2, 3, 4, 5]
        for result in results[5:]:
            assert not result.is_error and "power" in result.content[0].text
        assert device.calls.count("self.lamp.get_state") == 10
        # No reply to a host's call went upstream.
        to_upstream = [json.loads(raw).get("payload", {}).get("id") for raw in server.received]
        assert max(i for i in to_upstream if isinstance(i, int)) < 100


async def test_a_host_calls_the_device_between_conversations(tmp_path: Path) -> None:
    async with proxied(tmp_path) as (run, server, _, device):
        await conversation(device, server)
        await device.goodbye()
        async with asyncio.timeout(bound(5)):
            await server.goodbye.wait()
        received = len(server.received)
        async with Client(run.mcp_url, mode="legacy") as host:
            result = await host.call_tool(tool_name(run, STOCK, "self.lamp.turn_on"), {})
        assert not result.is_error and device.calls[-1] == "self.lamp.turn_on"
        assert json.loads(server.received[received - 1])["type"] == "goodbye"
        assert len(server.received) == received  # the upstream heard nothing of it
        again = await device.hello()  # and the next conversation still reaches the upstream
        assert hello_bytes(device) == server.hello_replies[-1] and stock_accepts_hello(again)


async def test_fleet_tools_reach_the_upstream_when_enabled(tmp_path: Path) -> None:
    async with proxied(tmp_path, upstream_fleet_tools=True) as (run, server, broker, device):
        other = MqttDevice("127.0.0.1", run.gateway.broker.port, OTHER,  # type: ignore[union-attr]
                           run.gateway.device_tokens[0], stock=False)  # fmt: skip
        async with other:
            await wait_listed(run, OTHER)
            tools = await conversation(device, server)
            remote = tool_name(run, OTHER, "self.lamp.turn_on")
            assert remote in [t["name"] for t in tools]
            assert tool_name(run, STOCK, "self.lamp.turn_on") not in [t["name"] for t in tools]
            reply = await server.call(remote)
            assert reply["result"]["content"][0]["text"] == "true"
        assert other.calls == ["self.lamp.turn_on"] and "self.lamp.turn_on" not in device.calls
        run.gateway.audit.flush()  # the call's record now, not with the next ones
        audit = (tmp_path / "gw" / "audit.log").read_text().splitlines()
        assert json.loads(audit[-1])["caller"] == f"upstream mqtt://127.0.0.1:{broker.port}"


async def test_without_fleet_tools_the_upstream_sees_the_device_only(tmp_path: Path) -> None:
    async with proxied(tmp_path) as (run, server, _, device):
        listed = await conversation(device, server)
        assert [t["name"] for t in listed] == model_tools(device)
        reply = await server.call(tool_name(run, STOCK, "self.lamp.turn_on"))
        assert "error" in reply or reply["result"].get("isError")  # the device knows no such tool


async def test_the_upstream_broker_going_down_costs_the_device_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with proxied(tmp_path) as (run, server, broker, device):
        await conversation(device, server)
        await broker.kill()
        await device.send({"type": "hello", "version": 3, "transport": "udp"})  # nowhere to go
        async with Client(run.mcp_url, mode="legacy") as host:
            result = await host.call_tool(tool_name(run, STOCK, "self.lamp.turn_on"), {})
            assert not result.is_error  # its reply came after the hello: the hello was seen
        assert "upstream 127.0.0.1" in caplog.text and "retrying" in caplog.text
        assert run.gateway.registry.find(STOCK).online  # type: ignore[union-attr]
        assert run.gateway.sessions.mqtt_proxies is not None
        relay = run.gateway.sessions.mqtt_proxies.relay_of(STOCK)
        assert relay is not None and not relay.upstream.connected.is_set()
        await broker.start()  # back: the client finds it again, the next conversation works
        async with asyncio.timeout(bound(10)):
            await relay.upstream.connected.wait()
            await server.ready.wait()
        await conversation(device, server)
        assert hello_bytes(device) == server.hello_replies[-1]


async def test_upstream_garbage_is_dropped_with_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with proxied(tmp_path) as (run, server, _, device):
        await server.send(b"\xff\xfe not text")
        await server.send(b"[1, 2, 3]")
        await server.send(b"{" * 5000)
        await server.send(b'{"type":"tts","text":"' + b"x" * SERVER_MESSAGE_BYTES + b'"}')
        await conversation(device, server)  # what follows still passes
        async with Client(run.mcp_url, mode="legacy") as host:
            result = await host.call_tool(tool_name(run, STOCK, "self.lamp.turn_on"), {})
        assert not result.is_error
        assert "not UTF-8" in caplog.text and "not a JSON object" in caplog.text
        assert f"bytes (more than {SERVER_MESSAGE_BYTES})" in caplog.text
        assert all(m.get("type") in ("hello", "mcp") for m in device.received)


async def test_the_device_leaving_ends_its_upstream_connection(tmp_path: Path) -> None:
    async with proxied(tmp_path) as (run, server, _, device):
        await conversation(device, server)
        assert run.gateway.sessions.mqtt_proxies is not None
        relay = run.gateway.sessions.mqtt_proxies.relay_of(STOCK)
        assert relay is not None and relay.upstream.connected.is_set()
        await device.stop()
        async with run.gateway.registry.device_changes() as changes:
            async with asyncio.timeout(bound(10)):
                while run.gateway.registry.find(STOCK).online:  # type: ignore[union-attr]
                    await anext(aiter(changes))
        async with asyncio.timeout(bound(10)):
            await relay.closed.wait()
        assert not relay.upstream.connected.is_set()
        assert run.gateway.sessions.mqtt_proxies.relay_of(STOCK) is None
        known = run.gateway.registry.find(STOCK)
        assert known is not None and known.upstream is not None
        assert known.upstream.state == "idle (device offline)"


async def test_a_stalled_upstream_holds_up_only_its_own_device(tmp_path: Path) -> None:
    """Device A's voice server stops reading (SIGSTOP): what A says beyond a small bound is
    dropped, never buffered; hosts still call A, and device B talks to its own server."""
    b_headers = {**STOCK_HEADERS, "Device-Id": OTHER.upper(), "Client-Id": "b-client"}
    async with voice_server(tmp_path / "a", STOCK_HEADERS["Device-Id"]) as a, voice_server(
        tmp_path / "b", b_headers["Device-Id"]
    ) as b:  # fmt: skip
        b_table = {OTHER: DeviceOptions(upstream=b.ota.ota_url)}  # B's own voice server
        async with gateway(tmp_path / "gw", **EMBEDDED, upstream_ota_url=a.ota.ota_url,
                           devices=b_table) as run:  # fmt: skip
            async with joined(run, STOCK_HEADERS) as device, joined(run, b_headers) as other:
                assert run.gateway.sessions.mqtt_proxies is not None
                relay = run.gateway.sessions.mqtt_proxies.relay_of(STOCK)
                assert relay is not None and a.broker.pid is not None
                os.kill(a.broker.pid, signal.SIGSTOP)
                try:
                    chatter = {"type": "listen", "state": "detect", "text": "x" * 60_000}
                    for _ in range(120):  # 7 MB: more than the sockets between can hold
                        await device.send(chatter)
                    async with Client(run.mcp_url, mode="legacy") as host:
                        lamp = tool_name(run, STOCK, "self.lamp.turn_on")
                        assert not (await host.call_tool(lamp, {})).is_error
                    assert relay.upstream.dropped > 0  # bounded: the rest was dropped
                    tools = await conversation(other, b.mqtt)  # B is not held up
                    assert [t["name"] for t in tools] == model_tools(other)
                finally:
                    os.kill(a.broker.pid, signal.SIGCONT)


class SlowForTheGateway(DeviceMcpServer):
    """Answers its voice server at once, the gateway's requests never (discovery gives up)."""

    async def handle(self, payload: Mapping[str, object]) -> dict[str, Any] | None:
        request_id = payload.get("id")
        if isinstance(request_id, int) and request_id in GATEWAY_IDS:
            return None
        return await super().handle(payload)


async def test_the_gateway_giving_up_leaves_the_device_its_voice_server(tmp_path: Path) -> None:
    async with voice_server(tmp_path / "upstream", STOCK_HEADERS["Device-Id"]) as server:
        async with gateway(tmp_path / "gw", **EMBEDDED, upstream_ota_url=server.ota.ota_url,
                           discovery_timeout=0.5) as run:  # fmt: skip
            proxies = run.gateway.sessions.mqtt_proxies
            assert proxies is not None
            reply = await ota_check_in(run)
            mcp = SlowForTheGateway(default_tools(), board="mqtt-esp32")
            registry = run.gateway.registry
            async with registry.device_changes() as changes, stock_device(reply, mcp) as device:
                async with asyncio.timeout(bound(10)):  # online, then the gateway gives up
                    while not registry.find(STOCK).online:  # type: ignore[union-attr]
                        await anext(aiter(changes))
                    while registry.find(STOCK).online:  # type: ignore[union-attr]
                        await anext(aiter(changes))
                relay = proxies.relay_of(STOCK)
                assert relay is not None and not relay.closed.is_set()
                async with asyncio.timeout(bound(10)):
                    await relay.upstream.connected.wait()
                tools = await conversation(device, server.mqtt)  # the voice goes on
                assert [t["name"] for t in tools] == model_tools(device)
                assert stock_accepts_hello(json.loads(hello_bytes(device)))
                tasks = {task.get_name() for task in asyncio.all_tasks()}  # for a task dump
                assert {f"gateway.upstream.{what}[{STOCK}]"
                        for what in ("device_gone", "closed")} <= tasks  # fmt: skip


async def test_a_device_waiting_for_approval_keeps_its_voice_server(tmp_path: Path) -> None:
    """Only what hosts see waits for approval; the device's conversations do not."""
    async with proxied(tmp_path, adoption="manual") as (run, server, _, device):
        known = run.gateway.registry.find(STOCK)
        assert known is not None and not known.approved
        assert not [t for t in run.gateway.registry.exposed_tools() if t.device is known]
        tools = await conversation(device, server)
        assert [t["name"] for t in tools] == model_tools(device)
        reply = await server.call("self.lamp.turn_on")
        assert reply["result"]["content"][0]["text"] == "true"


@pytest.mark.parametrize(
    ("endpoint", "error"),
    [
        ("mqtt.example:not-a-port", "mqtt endpoint 'mqtt.example:not-a-port' is not host[:port]"),
        # Followed from the gateway's host, as its WebSocket URL is: not to link-local (cloud
        # metadata) nor this machine unless [upstream] ota_url points there too.
        ("169.254.169.254:1883", "points at the link-local network"),
        ("[fe80::1]:8883", "points at the link-local network"),
    ],
)
async def test_an_mqtt_section_the_gateway_cannot_use_is_a_clear_error(
    tmp_path: Path, endpoint: str, error: str
) -> None:
    """The device gets a 502 it retries, nothing is kept, and the error says what is wrong."""
    upstream = UpstreamServer(offer="mqtt")
    upstream.mqtt_endpoint = endpoint
    upstream.activated.add(STOCK_HEADERS["Device-Id"])
    async with upstream.running(), gateway(
        tmp_path, **EMBEDDED, upstream_ota_url=upstream.ota_url
    ) as run:  # fmt: skip
        url = f"http://127.0.0.1:{run.device_port}/xiaozhi/ota/"
        async with httpx2.AsyncClient() as http:
            response = await http.post(url, headers=STOCK_HEADERS, json={})
        assert response.status_code == 502
        assert error in response.json()["error"]
        assert run.gateway.proxy is not None and run.gateway.proxy.mqtt is not None
        assert run.gateway.proxy.mqtt.get(STOCK) is None  # type: ignore[attr-defined]


async def test_after_a_gateway_restart_the_device_finds_its_server_again(tmp_path: Path) -> None:
    """A device checks in only at boot: the server's settings kept in the data dir serve it when
    it joins the broker of a gateway started since."""
    # The same broker port for both gateways (a device keeps it): one the kernel never hands
    # out for port 0 (tests/ports.py).
    listen = {**EMBEDDED, "mqtt_listen": ListenAddress("127.0.0.1", outside_ephemeral())}
    async with voice_server(tmp_path / "upstream", STOCK_HEADERS["Device-Id"]) as server:
        settings = {**listen, "upstream_ota_url": server.ota.ota_url}
        async with gateway(tmp_path / "gw", **settings) as run:
            reply = await ota_check_in(run)  # its boot, with the gateway before this one
        async with stock_device(reply) as device, gateway(tmp_path / "gw", **settings) as run:
            async with run.gateway.registry.changes() as changes:
                await until(changes, has_tools(run, STOCK))  # it found the broker by itself
            assert run.gateway.sessions.mqtt_proxies is not None
            relay = run.gateway.sessions.mqtt_proxies.relay_of(STOCK)
            assert relay is not None
            async with asyncio.timeout(bound(10)):
                await relay.upstream.connected.wait()
            tools = await conversation(device, server.mqtt)
            assert [t["name"] for t in tools] == model_tools(device)


@pytest.mark.parametrize("host", ["169.254.169.254", "2852039166", "169.254.169.254."])
async def test_a_broker_kept_where_the_server_has_no_say_is_not_followed(
    tmp_path: Path, host: str
) -> None:
    """Settings kept before the destination check existed: the device is served by the gateway
    alone, its broker never reached, and listings say why."""
    # The same broker port for both gateways (a device keeps it): one the kernel never hands
    # out for port 0 (tests/ports.py).
    listen = {**EMBEDDED, "mqtt_listen": ListenAddress("127.0.0.1", outside_ephemeral())}
    async with voice_server(tmp_path / "upstream", STOCK_HEADERS["Device-Id"]) as server:
        settings = {**listen, "upstream_ota_url": server.ota.ota_url}
        async with gateway(tmp_path / "gw", **settings) as run:
            reply = await ota_check_in(run)
        kept = tmp_path / "gw" / "upstream_mqtt.json"
        stored = json.loads(kept.read_text())
        stored[STOCK]["host"] = host  # as an older gateway kept it
        kept.write_text(json.dumps(stored))
        async with stock_device(reply), gateway(tmp_path / "gw", **settings) as run:
            async with run.gateway.registry.changes() as changes:
                await until(changes, has_tools(run, STOCK))  # the gateway serves it
            assert run.gateway.sessions.mqtt_proxies is not None
            assert run.gateway.sessions.mqtt_proxies.relay_of(STOCK) is None
            found = run.gateway.registry.find(STOCK)
            assert found is not None and found.upstream is not None
            assert "points at the link-local network" in found.upstream.state
