"""The test suite's MQTT device behaves as our firmware does where the cluster tests rely on it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.cluster.conftest import Proxy, pipe, relay_packets
from tests.conftest import DEVICE_TOKEN, bound
from tests.mqtt_helpers import Mosquitto, MqttDevice

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

DEVICE = "aa:bb:cc:dd:ee:43"
_SUBACK = 0x90


class RefusingSubscriptions(Proxy):
    """A real mosquitto as a client sees it through a NATS node that cannot create the consumer
    of a QoS 1 subscription yet (after a peer died): on the first ``refusing`` connections, every
    SUBACK says 0x80 (failure); later ones pass as the broker sent them."""

    refusing = 2
    connections = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        refuse = self.connections <= self.refusing
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        self._writers |= {writer, up_writer}

        def refused(packet: bytes) -> bytes:
            if refuse and packet[0] == _SUBACK:  # one topic a SUBSCRIBE here: its code last
                return packet[:-1] + b"\x80"
            return packet

        await asyncio.gather(pipe(reader, up_writer), relay_packets(up_reader, writer, refused))


async def test_a_refused_down_subscription_makes_the_device_reconnect(tmp_path: Path) -> None:
    """The broker refuses the device's down subscription twice (SUBACK 0x80): the device does
    not stay connected and deaf, it reconnects and subscribes again, as device_fw/fw_mqtt.py
    does, until the broker grants it."""
    async with Mosquitto(tmp_path / "broker") as broker, RefusingSubscriptions(broker.port) as node:
        device = MqttDevice("127.0.0.1", node.port, DEVICE, DEVICE_TOKEN, stock=False)
        async with device:
            async with asyncio.timeout(bound(10)):
                while device.subscriptions_refused < node.refusing:
                    await device.subscription_refused.wait()
                    device.subscription_refused.clear()
                await device.wait_connected()  # the third connection: granted
            assert node.connections == node.refusing + 1
