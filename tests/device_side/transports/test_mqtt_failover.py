"""Failover between a broker cluster's nodes: the order, the waits, refused subscriptions."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import aiomqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

from gateway.device_side.broker.aiomqtt_fixes import refused, subscribe_all
from gateway.device_side.transports.mqtt import BrokerLogin
from gateway.device_side.transports.mqtt.client import BrokerClient
from gateway.device_side.transports.mqtt.failover import Failover
from tests.conftest import bound
from tests.mqtt_helpers import Mosquitto

NODES = [BrokerLogin("n1", 1883), BrokerLogin("n2", 1883), BrokerLogin("n3", 1883)]


def test_a_lost_node_is_left_for_the_next_at_once_and_a_failed_round_backs_off() -> None:
    nodes = Failover(NODES, (0.5, 2.0))
    assert nodes.current.host == "n1" and nodes.where == "n1:1883"
    assert [nodes.failed(), nodes.current.host] == [0.0, "n2"]  # n1 died: n2 at once
    assert [nodes.failed(), nodes.current.host] == [0.0, "n3"]
    assert [nodes.failed(), nodes.current.host] == [0.5, "n1"]  # all three failed: wait
    assert [nodes.failed(), nodes.failed(), nodes.failed()] == [0.0, 0.0, 1.0]
    assert [nodes.failed(), nodes.failed(), nodes.failed()] == [0.0, 0.0, 2.0]  # at most 2
    nodes.ready()  # on n1 again: the next loss moves on at once, and backoff starts over
    assert [nodes.failed(), nodes.failed(), nodes.failed()] == [0.0, 0.0, 0.5]


def test_one_broker_is_backoff_alone() -> None:
    nodes = Failover(NODES[:1], (0.5, 5.0))
    assert [nodes.failed() for _ in range(5)] == [0.5, 1.0, 2.0, 4.0, 5.0]
    with pytest.raises(ValueError, match="at least one"):
        Failover([], (0.5, 5.0))


def test_a_suback_failure_code_is_a_refusal() -> None:
    granted = ReasonCode(PacketTypes.SUBACK, identifier=1)
    failure = ReasonCode(PacketTypes.SUBACK, identifier=0x80)
    assert not refused([granted]) and not refused([0, 1])
    assert refused([granted, failure]) and refused([0x80])


class _Refusing:
    """A connected client whose broker refuses ``times`` subscriptions, then grants them."""

    def __init__(self, times: int) -> None:
        self.asked = 0
        self._times = times

    async def subscribe(self, topic: str, qos: int) -> list[int]:
        self.asked += 1
        return [0x80] if self.asked <= self._times else [qos]


@pytest.mark.anyio
async def test_a_refused_subscription_is_asked_again_then_given_up() -> None:
    client = _Refusing(times=2)
    await subscribe_all(client, [("fleet/#", 1)], patience=5)  # type: ignore[arg-type]
    assert client.asked == 3
    stubborn = _Refusing(times=1000)
    with pytest.raises(aiomqtt.MqttError, match="refused the subscription to fleet/# for 0.6 s"):
        await subscribe_all(stubborn, [("fleet/#", 1)], patience=0.6)  # type: ignore[arg-type]


@pytest.mark.anyio
@pytest.mark.e2e
async def test_the_device_transport_moves_past_a_dead_node(tmp_path: Path) -> None:
    """The first node listed is down: the client connects to the next one, at once."""
    # Bound but not listening, and held for the test: a connection there is refused.
    with socket.socket() as dead:
        dead.bind(("127.0.0.1", 0))
        async with Mosquitto(tmp_path / "broker") as broker:
            client = BrokerClient(
                [
                    BrokerLogin("127.0.0.1", dead.getsockname()[1]),
                    BrokerLogin("127.0.0.1", broker.port),
                ],
                [("xiaozhi/+/up", 0)],
                on_connected=lambda: None,
                on_disconnected=lambda: None,
                on_message=lambda topic, payload: None,
                retry=(30.0, 30.0),  # a wait would outlast the test: none is taken
            )
            task = asyncio.create_task(client.run())
            try:
                async with asyncio.timeout(bound(5)):
                    await client.connected.wait()
                assert client.login.port == broker.port
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
