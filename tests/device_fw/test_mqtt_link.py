"""The MQTT link against a real mosquitto broker, a test client playing the gateway.

The gateway's own MQTT transport is being written in parallel; until it lands, these tests
check the link against the broker alone: topics, credentials, status and last will, and MCP
over up/down with the same envelopes as over WebSocket.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiomqtt
import pytest

from device_fw.fw_link_mqtt import MqttLink
from device_fw.fw_mqtt import MqttClient, MqttError
from tests.conftest import DEVICE_TOKEN, bound
from tests.device_fw.conftest import Broker, firmware_config, running_firmware

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

DEVICE_ID = "02:00:00:00:f1:0a"
BASE = f"xiaozhi/{DEVICE_ID}/"


def payload_of(message: aiomqtt.Message) -> bytes:
    """A message's payload as bytes."""
    assert isinstance(message.payload, bytes)
    return message.payload


class Peer:
    """The gateway's side: a broker client reading the device's topics."""

    def __init__(self, client: aiomqtt.Client) -> None:
        self.client = client
        self._messages = aiter(client.messages)
        self._ids = 0

    async def next(self, topic: str) -> aiomqtt.Message:
        """The next message on ``topic`` (others are skipped)."""
        async with asyncio.timeout(bound(10)):
            while True:
                message = await anext(self._messages)
                if message.topic.value == topic:
                    return message

    async def request(self, method: str, **params: Any) -> dict[str, Any]:
        """Publish a JSON-RPC request on down; return the reply payload read from up."""
        self._ids += 1
        payload = {"jsonrpc": "2.0", "id": self._ids, "method": method, "params": params}
        envelope = {"session_id": "", "type": "mcp", "payload": payload}
        await self.client.publish(BASE + "down", json.dumps(envelope), qos=1)
        message = json.loads(payload_of(await self.next(BASE + "up")))
        assert message["type"] == "mcp" and message["payload"]["id"] == self._ids, message
        reply: dict[str, Any] = message["payload"]
        return reply


@asynccontextmanager
async def peer(broker: Broker, name: str = "gateway") -> AsyncIterator[Peer]:
    """A client subscribed to every topic of the test device."""
    async with aiomqtt.Client("127.0.0.1", broker.port, identifier=name) as client:
        await client.subscribe(BASE + "#", qos=1)
        yield Peer(client)


async def test_firmware_on_micropython_serves_mcp_over_mqtt_and_leaves_a_will(
    tmp_path: Path, mosquitto: Broker
) -> None:
    """The unix port connects, says online (retained), answers MCP from down on up, and when
    killed the broker publishes its retained offline will."""
    mqtt = {"host": "127.0.0.1", "port": mosquitto.port, "keepalive": 30}
    config = firmware_config(DEVICE_ID, transport="mqtt", mqtt=mqtt)
    async with peer(mosquitto) as gateway:
        async with running_firmware(tmp_path / "fw", config) as firmware:
            online = await gateway.next(BASE + "status")
            init = await gateway.request("initialize", protocolVersion="2024-11-05")
            listing = await gateway.request("tools/list", withUserTools=True)
            switched = await gateway.request(
                "tools/call", name="self.led.set_power", arguments={"on": True}
            )
            state = await gateway.request("tools/call", name="self.led.get_state")
            await firmware.stop(signal.SIGKILL)  # no DISCONNECT: the broker sends the will
            offline = await gateway.next(BASE + "status")
    async with peer(mosquitto, "late") as late:
        retained = await late.next(BASE + "status")
    assert online.payload == b"online" and offline.payload == b"offline"
    assert retained.payload == b"offline" and retained.retain
    assert init["result"]["serverInfo"] == {"name": "fwtest", "version": "0.1.0"}
    names = [tool["name"] for tool in listing["result"]["tools"]]
    assert names[:3] == ["self.get_device_status", "self.led.set_power", "self.led.get_state"]
    assert "self.reboot" in names
    assert switched["result"]["content"][0]["text"] == "true"
    assert json.loads(state["result"]["content"][0]["text"]) == {"on": True}


async def test_link_on_cpython_closes_cleanly_with_a_retained_offline(mosquitto: Broker) -> None:
    """The same link on CPython: online, a down message arrives, close() says offline."""
    link = MqttLink("127.0.0.1", mosquitto.port, DEVICE_ID, DEVICE_TOKEN, keepalive=30)
    async with peer(mosquitto) as gateway:
        await link.open()
        assert (await gateway.next(BASE + "status")).payload == b"online"
        await gateway.client.publish(BASE + "down", b'{"type":"mcp","payload":{"x":1}}', qos=1)
        async with asyncio.timeout(bound(10)):
            received = await link.recv()
        await link.send('{"type":"mcp","payload":{"y":2}}')
        sent = await gateway.next(BASE + "up")
        await link.close()
        offline = await gateway.next(BASE + "status")
    assert received == {"type": "mcp", "payload": {"x": 1}}
    assert json.loads(payload_of(sent)) == {"type": "mcp", "payload": {"y": 2}}
    assert offline.payload == b"offline"


async def test_the_broker_checks_the_credentials(mosquitto: Broker) -> None:
    """The right password connects; a wrong one is CONNACK "not authorised" (5): MqttError."""
    good = MqttClient("plain-device", "127.0.0.1", mosquitto.auth_port, "plain-device",
                      DEVICE_TOKEN)  # fmt: skip
    await good.connect(timeout=bound(10))
    await good.disconnect()
    bad = MqttClient("plain-device", "127.0.0.1", mosquitto.auth_port, "plain-device", "wrong")
    with pytest.raises(MqttError) as refused:
        await bad.connect(timeout=bound(10))
    assert refused.value.code == 5
