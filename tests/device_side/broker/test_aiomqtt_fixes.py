"""The gateway's own MQTT client: its work per publish does not grow with those in flight."""

from __future__ import annotations

import asyncio
from collections.abc import Generator

import pytest

from gateway.device_side.broker import GATEWAY_LOGIN
from gateway.device_side.broker.aiomqtt_fixes import FleetClient
from tests.conftest import bound
from tests.device_side.broker.test_embedded import DEVICE, TOKEN, broker, client, first_message

pytestmark = pytest.mark.anyio

IN_FLIGHT = 50


class _Counted(FleetClient):
    walks = 0

    @property
    def _pending_calls(self) -> Generator[int, None, None]:
        type(self).walks += 1  # aiomqtt walked every call in flight, twice per publish
        yield from ()


async def test_publishes_in_flight_are_not_walked_for_each_publish() -> None:
    """Fifty publishes awaiting their PUBACK at once: none walks the others; all arrive."""
    async with broker() as b, client(b, DEVICE, TOKEN) as device:
        gateway = _Counted("127.0.0.1", b.port, username=GATEWAY_LOGIN,
                           password=b.gateway_password, identifier="gw-test",
                           timeout=bound(5))  # fmt: skip
        async with gateway, asyncio.timeout(bound(10)):
            topic = f"xiaozhi/{DEVICE}/down"
            await asyncio.gather(
                *(gateway.publish(topic, str(n).encode(), qos=1) for n in range(IN_FLIGHT))
            )
            assert (await first_message(device)).payload == b"0"
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
