"""End to end over MQTT: stock-like and firmware-like devices, the embedded broker and mosquitto.

Each test runs a real gateway; MCP hosts are the SDK's client over streamable HTTP.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiomqtt
import httpx2
import mcp.types as types
import pytest
from mcp import Client

from gateway.app import Running
from gateway.config import ListenAddress
from gateway.simulator import DeviceMcpServer, default_tools
from tests.conftest import DEVICE_TOKEN, bound, gateway
from tests.device_side.test_ota import STOCK_BODY, STOCK_HEADERS
from tests.e2e.helpers import has_tools, listed_device, until
from tests.mqtt_helpers import Mosquitto, MqttDevice, stock_accepts_hello

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

STOCK = "aa:bb:cc:dd:ee:ff"
FIRMWARE = "aa:bb:cc:dd:ee:02"
# Stock devices arrive without a token: these tests are about MQTT, so they are let in at once
# (test_device_trust.py covers approval).
EMBEDDED: dict[str, Any] = {"mqtt_listen": ListenAddress("127.0.0.1", 0), "adoption": "auto"}


def tool_name(run: Running, device_id: str, tool: str) -> str:
    """The MCP name the gateway gave ``tool`` of ``device_id``."""
    names = [
        t.name
        for t in run.gateway.registry.exposed_tools()
        if t.device.device_id == device_id and t.spec.name == tool
    ]
    assert names, f"{tool} of {device_id} is not exposed"
    return names[0]


async def wait_listed(run: Running, device_id: str) -> None:
    """Wait until the gateway lists the device's tools with the device online."""
    async with run.gateway.registry.changes() as changes:
        await until(changes, has_tools(run, device_id))


async def ota_check_in(run: Running, headers: dict[str, str] = STOCK_HEADERS) -> dict[str, Any]:
    """What a stock device does at boot: POST to the OTA endpoint."""
    url = f"http://127.0.0.1:{run.device_port}/xiaozhi/ota/"
    async with httpx2.AsyncClient() as http:
        response = await http.post(url, headers=headers, json=STOCK_BODY)
    assert response.status_code == 200
    reply: dict[str, Any] = response.json()
    return reply


def stock_device(
    reply: dict[str, Any], mcp: DeviceMcpServer | None = None, device_id: str = STOCK
) -> MqttDevice:
    """A stock-like device configured from its OTA reply only."""
    mqtt = reply["mqtt"]
    host, port = mqtt["endpoint"].rsplit(":", 1)
    return MqttDevice(
        host,
        int(port),
        device_id,
        mqtt["password"],
        stock=True,
        username=mqtt["username"],
        client_id=mqtt["client_id"],
        publish_topic=mqtt["publish_topic"],
        mcp=mcp,
    )


async def test_stock_device_ota_then_mqtt_then_tools_callable(tmp_path: Path) -> None:
    """OTA POST, MQTT with the OTA credentials (never subscribing), tools called over MCP."""
    async with gateway(tmp_path, **EMBEDDED) as run:
        reply = await ota_check_in(run)
        async with stock_device(reply) as device:
            await wait_listed(run, STOCK)
            assert device.received and not device.subscribe
            async with Client(run.mcp_url, mode="legacy") as client:
                names = {t.name for t in (await client.list_tools()).tools}
                lamp = tool_name(run, STOCK, "self.lamp.turn_on")
                assert lamp in names
                result = await client.call_tool(lamp, {})
                assert not result.is_error and result.content[0].text == "true"
                # A conversation: the hello reply is one stock firmware accepts.
                hello = await device.hello()
                assert stock_accepts_hello(hello) and hello["session_id"]
                await device.goodbye()  # ends the conversation, not the MQTT presence
                state = await client.call_tool(tool_name(run, STOCK, "self.lamp.get_state"), {})
                assert json.loads(state.content[0].text)["power"] is True
                assert run.gateway.registry.find(STOCK).online  # type: ignore[union-attr]
        assert device.calls == ["self.lamp.turn_on", "self.lamp.get_state"]
        record = run.gateway.registry.find(STOCK)
        assert record is not None and record.record.transport == "mqtt"
        assert record.firmware == "2.4.2"


async def test_alias_from_the_ota_check_in_survives_another_server_info_name(
    tmp_path: Path,
) -> None:
    """Named after its OTA board, a device keeps that name when initialize says py-xiaozhi."""
    async with gateway(tmp_path, **EMBEDDED) as run:
        registry = run.gateway.registry
        reply = await ota_check_in(run)  # board bread-compact-wifi
        checked_in = registry.find(STOCK)
        assert checked_in is not None and checked_in.alias == "bread-compact-wifi_eeff"
        mcp = DeviceMcpServer(default_tools(), board="py-xiaozhi")  # its serverInfo.name
        async with stock_device(reply, mcp), Client(run.mcp_url, mode="legacy") as client:
            await wait_listed(run, STOCK)
            names = [t.name for t in (await client.list_tools()).tools]
            [listed] = (await client.call_tool("list_devices", {})).content
    assert isinstance(listed, types.TextContent)
    shown = json.loads(listed.text)["devices"]
    assert [(d["device"], d["board"]) for d in shown] == [
        ("bread-compact-wifi_eeff", "bread-compact-wifi")  # the OTA board.type, not serverInfo
    ]
    assert registry.find(STOCK) is checked_in and checked_in.alias == "bread-compact-wifi_eeff"
    own = [t.name for t in registry.exposed_tools() if t.device is checked_in]
    assert own and all(name.startswith("bread-compact-wifi_eeff_") for name in own)
    assert set(own) <= set(names)
    assert not any(name.startswith("py-xiaozhi") for name in names)


async def test_mqtt_and_websocket_devices_side_by_side_on_the_embedded_broker(
    tmp_path: Path,
) -> None:
    """One gateway: an MQTT device (our firmware's way) and a WebSocket device, one MCP list."""
    async with gateway(tmp_path, **EMBEDDED) as run:
        broker = run.gateway.broker
        assert broker is not None
        mqtt = MqttDevice("127.0.0.1", broker.port, FIRMWARE, DEVICE_TOKEN, stock=False)
        async with mqtt, listed_device(run, "02:00:00:00:00:09") as ws_device:
            await wait_listed(run, FIRMWARE)
            await call_both(run, mqtt, ws_device)


async def call_both(run: Running, mqtt: MqttDevice, ws_device: Any) -> None:
    """List tools from an MCP client and call the same tool on both devices."""
    async with Client(run.mcp_url, mode="legacy") as client:
        names = {t.name for t in (await client.list_tools()).tools}
        over_mqtt = tool_name(run, mqtt.device_id, "self.lamp.turn_on")
        over_ws = tool_name(run, "02:00:00:00:00:09", "self.lamp.turn_on")
        assert {over_mqtt, over_ws} <= names and over_mqtt != over_ws
        for name in (over_mqtt, over_ws):
            result = await client.call_tool(name, {})
            assert not result.is_error and result.content[0].text == "true"
    assert mqtt.calls == ["self.lamp.turn_on"]
    assert [name for name, _ in ws_device.calls] == ["self.lamp.turn_on"]


async def test_devices_over_mosquitto_side_by_side_with_websocket(tmp_path: Path) -> None:
    """mqtt.mode = external: a real mosquitto carries the MQTT device."""
    async with Mosquitto(tmp_path / "mosquitto") as broker:
        external = {"mqtt_mode": "external", "mqtt_host": "127.0.0.1", "mqtt_port": broker.port}
        async with gateway(tmp_path / "gw", **external) as run:
            assert run.gateway.broker is None
            mqtt = MqttDevice("127.0.0.1", broker.port, FIRMWARE, DEVICE_TOKEN, stock=False)
            async with mqtt, listed_device(run, "02:00:00:00:00:09") as ws_device:
                await wait_listed(run, FIRMWARE)
                await call_both(run, mqtt, ws_device)


async def test_broker_restart_devices_come_back_and_nothing_is_lost(tmp_path: Path) -> None:
    """Kill mosquitto: the device goes offline; restart it: it is back, calls work again."""
    broker = Mosquitto(tmp_path / "mosquitto")
    await broker.start()
    hide = {"offline_tools": "hide", "offline_grace": 0.01}  # offline becomes a visible change
    external = {"mqtt_mode": "external", "mqtt_host": "127.0.0.1", "mqtt_port": broker.port}
    try:
        async with gateway(tmp_path / "gw", **external, **hide) as run:
            registry = run.gateway.registry
            async with MqttDevice("127.0.0.1", broker.port, FIRMWARE, DEVICE_TOKEN, stock=False):
                await wait_listed(run, FIRMWARE)
                before = [(t.name, t.spec) for t in registry.exposed_tools()]
                device = registry.find(FIRMWARE)
                assert device is not None
                record = (device.alias, device.catalogue, device.record.first_seen)
                async with registry.changes() as changes:
                    await broker.kill()
                    await until(changes, lambda: not has_tools(run, FIRMWARE)())
                    await broker.start()
                    await until(changes, has_tools(run, FIRMWARE))
                assert [(t.name, t.spec) for t in registry.exposed_tools()] == before
                assert (device.alias, device.catalogue, device.record.first_seen) == record
                async with Client(run.mcp_url, mode="legacy") as client:
                    name = tool_name(run, FIRMWARE, "self.lamp.turn_on")
                    result = await client.call_tool(name, {})
                assert not result.is_error
    finally:
        await broker.kill()


async def test_embedded_broker_restart_devices_come_back(tmp_path: Path) -> None:
    """Stop and restart the embedded broker: the stock device reconnects and is listed again."""
    hide = {"offline_tools": "hide", "offline_grace": 0.01}
    async with gateway(tmp_path, **EMBEDDED, **hide) as run:
        broker = run.gateway.broker
        assert broker is not None
        reply = await ota_check_in(run)
        async with stock_device(reply):
            await wait_listed(run, STOCK)
            async with run.gateway.registry.changes() as changes:
                await broker.stop()
                await until(changes, lambda: not has_tools(run, STOCK)())
                await broker.start()
                await until(changes, has_tools(run, STOCK))
            async with Client(run.mcp_url, mode="legacy") as client:
                result = await client.call_tool(tool_name(run, STOCK, "self.lamp.turn_on"), {})
            assert not result.is_error


def login(port: int, device_id: str, password: str) -> aiomqtt.Client:
    """A raw MQTT login as ``device_id``."""
    return aiomqtt.Client("127.0.0.1", port, username=device_id, password=password,
                          identifier=device_id, timeout=bound(5))  # fmt: skip


async def test_embedded_broker_refuses_a_wrong_password(tmp_path: Path) -> None:
    """A device with a wrong password never gets in; the right ones do."""
    async with gateway(tmp_path, **EMBEDDED) as run:
        broker = run.gateway.broker
        assert broker is not None
        issued = (await ota_check_in(run))["mqtt"]["password"]
        for device_id, password in [
            (STOCK, "wrong"),
            (STOCK, issued[:-1] + "x"),
            (STOCK, ""),
            (FIRMWARE, issued),
        ]:  # issued: for its own device only
            with pytest.raises(aiomqtt.MqttCodeError):
                async with login(broker.port, device_id, password):
                    pass
        for device_id, password in [(STOCK, issued), (FIRMWARE, DEVICE_TOKEN)]:
            async with login(broker.port, device_id, password):
                pass


async def test_device_cannot_speak_for_another_device(tmp_path: Path) -> None:
    """What a device publishes on another device's topics reaches nobody."""
    async with gateway(tmp_path, **EMBEDDED) as run:
        broker = run.gateway.broker
        assert broker is not None
        async with stock_device(await ota_check_in(run)) as victim:
            await wait_listed(run, STOCK)
            async with login(broker.port, FIRMWARE, DEVICE_TOKEN) as intruder:
                # A forged answer to the gateway's next request, and a command to the victim.
                payload = {"jsonrpc": "2.0", "id": 3, "result": {"content": []}}
                forged = {"session_id": "", "type": "mcp", "payload": payload}
                await intruder.publish(f"xiaozhi/{STOCK}/up", json.dumps(forged))
                await intruder.publish(f"xiaozhi/{STOCK}/down", b'{"type":"system"}')
            async with Client(run.mcp_url, mode="legacy") as client:
                result = await client.call_tool(tool_name(run, STOCK, "self.lamp.turn_on"), {})
            assert not result.is_error and result.content[0].text == "true"
            assert all(m.get("type") != "system" for m in victim.received)
