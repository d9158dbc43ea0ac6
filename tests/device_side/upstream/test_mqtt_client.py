"""UpstreamMqttClient against a real mosquitto: the device's login, TLS exactly on 8883."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiomqtt
import pytest

from gateway.device_side.upstream import mqtt_client
from gateway.device_side.upstream.mqtt_client import (
    MAX_QUEUED,
    MAX_QUEUED_BYTES,
    UpstreamMqttClient,
)
from gateway.device_side.upstream.mqtt_settings import parse_upstream_mqtt
from tests.conftest import bound
from tests.mqtt_helpers import Mosquitto
from tests.test_mqtt_helpers import RefusingSubscriptions

pytestmark = pytest.mark.anyio

LOGIN = {"client_id": "GID_test@@@aa_bb@@@uuid", "username": "dev", "password": "pw",
         "publish_topic": "device-server", "subscribe_topic": "null"}  # fmt: skip


def port_8883_free() -> bool:
    with socket.socket() as sock, contextlib.suppress(OSError):
        sock.bind(("127.0.0.1", 8883))
        return True
    return False


@contextlib.asynccontextmanager
async def running(client: UpstreamMqttClient) -> AsyncIterator[asyncio.Task[None]]:
    """The client running in a task, cancelled (again, if aiomqtt swallowed it) at the end."""
    task = asyncio.create_task(client.run())
    try:
        yield task
    finally:
        while not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=0.5)


# paho leaves the socket of a failed TLS handshake to the garbage collector (it never becomes
# the client's), which closes it with a ResourceWarning: not the gateway's to fix.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_no_port_means_tls_on_8883_verified_as_on_the_device(tmp_path: Path) -> None:
    """xiaozhi.me's endpoint has no port: TLS on 8883, checked against the CAs given."""
    if not port_8883_free():
        pytest.skip("port 8883 is taken on this machine")
    broker = Mosquitto(tmp_path, users={"dev": "pw", "server": "spw"}, tls=True)
    broker.port = 8883  # what stock firmware means by an endpoint without a port
    async with broker:
        settings = parse_upstream_mqtt({**LOGIN, "endpoint": "127.0.0.1"})
        assert settings.tls and settings.port == 8883
        states: asyncio.Queue[str] = asyncio.Queue()
        # The public CAs do not know the broker's own: refused, said once, retried.
        untrusted = UpstreamMqttClient("aa:bb", settings, lambda raw: None, retry=(0.05, 0.1),
                                       on_state=states.put_nowait)  # fmt: skip
        async with running(untrusted):
            async with asyncio.timeout(bound(10)):
                state = await states.get()
        assert "certificate verify failed" in state and not untrusted.connected.is_set()
        # With its CA trusted, the device's login works and messages flow.
        context = ssl.create_default_context(cafile=str(broker.cert))
        async with aiomqtt.Client("127.0.0.1", 8883, username="server", password="spw",
                                  identifier="server", tls_context=context) as server:  # fmt: skip
            await server.subscribe("device-server")
            client = UpstreamMqttClient("aa:bb", settings, lambda raw: None, ca_file=broker.cert)
            async with running(client):
                async with asyncio.timeout(bound(10)):
                    await client.connected.wait()
                assert client.send(b'{"type":"hello"}')
                async with asyncio.timeout(bound(10)):
                    message = await anext(aiter(server.messages))
        assert message.payload == b'{"type":"hello"}'


def test_what_waits_for_the_connection_is_bounded_in_messages_and_bytes() -> None:
    """A device's hello sent as it connects waits for the upstream; a flood does not."""
    settings = parse_upstream_mqtt({**LOGIN, "endpoint": "127.0.0.1:1883"})
    client = UpstreamMqttClient("aa:bb", settings, lambda raw: None)
    assert not client.connected.is_set()
    assert all(client.send(b'{"type":"hello"}') for _ in range(MAX_QUEUED))
    assert not client.send(b'{"type":"listen"}') and client.dropped == 1
    large = UpstreamMqttClient("aa:bb", settings, lambda raw: None)
    assert large.send(b"x" * (MAX_QUEUED_BYTES - 10))
    assert not large.send(b"x" * 11) and large.send(b"x" * 10)


async def test_a_refused_subscription_reconnects_rather_than_stay_deaf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The upstream broker refuses the device's subscription on the first connection (SUBACK
    0x80, asked again meanwhile): the client reconnects, subscribes again, and the server's
    messages reach the device."""
    monkeypatch.setattr(mqtt_client, "_SUBSCRIBE_PATIENCE", 1.0)  # shipped: 10 s
    async with Mosquitto(tmp_path, users={"dev": "pw", "server": "spw"}) as broker, \
            RefusingSubscriptions(broker.port) as node:  # fmt: skip
        node.refusing = 1
        login = {**LOGIN, "subscribe_topic": "devices/aa_bb"}
        settings = parse_upstream_mqtt({**login, "endpoint": f"127.0.0.1:{node.port}"})
        delivered: asyncio.Queue[bytes] = asyncio.Queue()
        client = UpstreamMqttClient("aa:bb", settings, delivered.put_nowait, retry=(0.05, 0.1))
        async with running(client):
            async with asyncio.timeout(bound(10)):
                await client.connected.wait()
            assert node.connections == 2
            async with aiomqtt.Client("127.0.0.1", broker.port, username="server",
                                      password="spw", identifier="server") as server:  # fmt: skip
                await server.publish("devices/aa_bb", b'{"type":"hello"}', qos=1)
            async with asyncio.timeout(bound(10)):
                assert await delivered.get() == b'{"type":"hello"}'
