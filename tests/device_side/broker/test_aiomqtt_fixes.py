"""aiomqtt mended (gateway/device_side/broker/aiomqtt_fixes.py): the gateway's own client's work
per publish does not grow with those in flight; a socket closed before the loop gets to register
it is left alone, a live one is served."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Generator
from pathlib import Path
from typing import Any

import aiomqtt
import pytest

from gateway.device_side.broker.aiomqtt_fixes import FleetClient, mend_socket_registration
from tests.conftest import bound
from tests.mqtt_helpers import Mosquitto

pytestmark = pytest.mark.anyio

IN_FLIGHT = 50
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
