"""aiomqtt mended (gateway/compat/aiomqtt.py, gateway/device_side/broker/aiomqtt_fixes.py): the
gateway's own client's work per publish does not grow with those in flight; a socket closed
before the loop gets to register it is left alone, a live one is served; a publish stopped as its
PUBACK arrives stays stopped."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiomqtt
import pytest

from gateway.cluster.client import ClusterClient
from gateway.cluster.records import ClusterTopics
from gateway.compat.aiomqtt import FleetClient, mend_socket_registration
from gateway.device_side.transports.mqtt.client import BrokerClient, BrokerLogin
from tests.conftest import bound
from tests.mqtt_helpers import Mosquitto

pytestmark = pytest.mark.anyio

IN_FLIGHT = 50
Publish = Callable[[str, bytes], Awaitable[object]]
DEVICE = "aa:bb:cc:dd:ee:01"


class _Counted(FleetClient):
    walks = 0

    @property
    def _pending_calls(self) -> Generator[int, None, None]:
        type(self).walks += 1  # aiomqtt walked every call in flight, twice per publish
        yield from ()


async def test_publishes_in_flight_are_not_walked_for_each_publish(tmp_path: Path) -> None:
    """Fifty publishes awaiting their PUBACK at once: none walks the others; all arrive."""
    topic = f"xiaozhi/{DEVICE}/down"
    async with Mosquitto(tmp_path / "broker") as b:
        device = aiomqtt.Client("127.0.0.1", b.port, identifier=DEVICE, timeout=bound(5))
        gateway = _Counted("127.0.0.1", b.port, identifier="gw-test", timeout=bound(5))
        async with device, gateway, asyncio.timeout(bound(10)):
            await device.subscribe(topic)
            await asyncio.gather(
                *(gateway.publish(topic, str(n).encode(), qos=1) for n in range(IN_FLIGHT))
            )
            assert (await anext(device.messages)).payload == b"0"
    assert _Counted.walks == 0


async def test_a_message_id_already_in_flight_is_refused() -> None:
    """As aiomqtt's: one pending call per message id, removed when it ends."""
    c = FleetClient("127.0.0.1", 1)
    with c._pending_call(7, "first", c._pending_publishes):
        assert c._pending_publishes == {7: "first"}
        with pytest.raises(RuntimeError, match="7"), c._pending_call(7, "again", {}):
            pass
    assert c._pending_publishes == {}
    c.pending_calls_threshold = 0
    with c._pending_call(8, "warned", c._pending_subscribes):
        assert 8 in c._pending_subscribes


async def _loop_turn() -> None:
    """Until the callbacks scheduled before now have run (they run in order)."""
    done = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon_threadsafe(done.set_result, None)
    await done


@pytest.mark.parametrize("callback", ["on_socket_open", "on_socket_register_write"])
async def test_a_socket_closed_before_its_registration_is_left_alone(callback: str) -> None:
    """paho tells of its socket (from the connecting thread) and the connection closes before
    the loop registers it, as when a client is cancelled while connecting: no error in the
    loop, and the closed descriptor is not watched."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: errors.append(context))
    try:
        client = mend_socket_registration(aiomqtt.Client("127.0.0.1", 1))
        paho = client._client
        ours, theirs = socket.socketpair()
        with theirs:
            paho._sock = ours  # as paho holds it while connecting
            fd = ours.fileno()
            getattr(paho, callback)(paho, None, ours)
            paho._sock = None  # paho's own close: forgotten, then closed
            ours.close()
            await _loop_turn()
        assert errors == []
        selector_map = loop._selector.get_map()  # type: ignore[attr-defined]
        assert fd not in selector_map
    finally:
        loop.set_exception_handler(None)


async def test_a_mended_client_still_talks_to_a_broker(tmp_path: Path) -> None:
    """The mended registration serves a real connection: publish, subscribe, receive."""
    async with Mosquitto(tmp_path / "broker") as broker:
        client = mend_socket_registration(aiomqtt.Client("127.0.0.1", broker.port))
        async with client:
            await client.subscribe("mended/+", qos=1)
            await client.publish("mended/one", b"hello", qos=1)
            async with asyncio.timeout(bound(5)):
                message = await anext(client.messages)
        assert (message.topic.value, message.payload) == ("mended/one", b"hello")


@asynccontextmanager
async def _connected(side: str, port: int) -> AsyncIterator[tuple[Publish, aiomqtt.Client]]:
    """The gateway's device transport client, or a replica's cluster client, connected to the
    broker on ``port``: its ``publish`` and the aiomqtt client under it."""
    login = BrokerLogin("127.0.0.1", port)
    if side == "device transport":
        device_side = BrokerClient(login, [], on_connected=lambda: None,
                                   on_disconnected=lambda: None,
                                   on_message=lambda topic, payload: None,
                                   retry=(0.5, 5.0))  # fmt: skip
        run, connected = device_side.run, device_side.connected

        async def publish(topic: str, payload: bytes) -> object:
            return await device_side.publish(topic, payload)

        def client() -> aiomqtt.Client | None:
            return device_side._client
    else:
        cluster = ClusterClient([login], ClusterTopics("fleet"), "gw-x", lambda topic, data: None,
                                _nothing, lambda: None)  # fmt: skip
        run, connected = cluster.run, cluster.connected

        async def publish(topic: str, payload: bytes) -> object:
            return await cluster.publish(topic, payload, retain=False)

        def client() -> aiomqtt.Client | None:
            return cluster._client

    task = asyncio.create_task(run())
    try:
        async with asyncio.timeout(bound(15)):
            await connected.wait()
        connection = client()
        assert connection is not None
        yield publish, connection
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _nothing() -> None:
    pass


@pytest.mark.parametrize("side", ["device transport", "cluster"])
async def test_a_publish_stopped_as_its_puback_arrives_stays_stopped(
    tmp_path: Path, side: str
) -> None:
    """A task cancelled in the very turn of the loop that brings its publish's PUBACK ends
    cancelled. aiomqtt awaits the PUBACK with ``asyncio.wait_for``, which on Python 3.11 then
    returns the result and loses the cancellation: a device session being stopped carried on,
    and the gateway's stop waited for it for ever (tests/cluster/test_replicas.py's cold
    replica, about 1 run in 45)."""
    async with (
        Mosquitto(tmp_path / "broker") as broker,
        _connected(side, broker.port) as (
            publish,
            client,
        ),
    ):
        paho = client._client
        acknowledged = paho.on_publish
        publishing: list[asyncio.Task[object]] = []

        def on_publish(*args: Any) -> None:
            acknowledged(*args)  # aiomqtt wakes the publish...
            publishing[0].cancel()  # ...and its task is stopped in the same turn of the loop

        paho.on_publish = on_publish
        publishing.append(asyncio.create_task(publish("fleet/stopped", b"x")))
        async with asyncio.timeout(bound(10)):
            [outcome] = await asyncio.gather(*publishing, return_exceptions=True)
        assert publishing[0].cancelled(), f"the publish returned {outcome!r}: not stopped"
        publishing[0] = asyncio.create_task(publish("fleet/stopped", b"y"))  # no cancel pending:
        paho.on_publish = acknowledged  # the client serves on, the next publish goes through
        async with asyncio.timeout(bound(10)):
            await publishing[0]
