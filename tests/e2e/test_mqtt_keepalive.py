"""The MQTT keepalive: a device that leaves after a silence stays online beside an idle gateway.

py-xiaozhi closes its MQTT link after 120 s without a message and never comes back; the broker's
own PINGREQ/PINGRESP do not count. Here the silence limit is shortened, and so is
``[mqtt] keepalive_interval``; the device is stock-like (OTA check-in, embedded broker).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.config import load_config
from gateway.errors import ConfigError
from gateway.protocol import PROBE_ID
from tests.conftest import bound, gateway
from tests.e2e.helpers import until
from tests.e2e.test_mqtt import EMBEDDED, STOCK, ota_check_in, stock_device, wait_listed

pytestmark = [pytest.mark.e2e]

SILENCE_LIMIT = bound(1.5)  # seconds without a message after which the device leaves


def pings(received: list[dict[str, object]]) -> int:
    return sum(
        1
        for message in received
        if isinstance(payload := message.get("payload"), dict)
        and payload.get("method") == "ping"
        and payload.get("id") == PROBE_ID
    )


@pytest.mark.anyio
async def test_an_idle_device_that_counts_only_its_messages_stays_online(tmp_path: Path) -> None:
    """Across several silence limits with nothing to do, the device is pinged and stays."""
    keepalive = {"mqtt_keepalive_interval": SILENCE_LIMIT / 3}
    async with gateway(tmp_path, **EMBEDDED, **keepalive) as run:
        reply = await ota_check_in(run)
        device = stock_device(reply)
        device.idle_close = SILENCE_LIMIT
        async with device:
            await wait_listed(run, STOCK)
            listed = len(device.received)
            with pytest.raises(TimeoutError):  # the test is that this long passes quietly
                async with asyncio.timeout(4 * SILENCE_LIMIT):
                    await device.gave_up.wait()
            assert device.connected.is_set()
            assert run.gateway.registry.find(STOCK).online  # type: ignore[union-attr]
            # Pings only: nothing that would start a conversation (no hello, no tts).
            idle = device.received[listed:]
            assert pings(idle) >= 4 and pings(idle) == len(idle)


@pytest.mark.anyio
async def test_without_the_keepalive_the_same_device_drops_off(tmp_path: Path) -> None:
    """keepalive_interval = 0 (off): the device leaves after its silence and is offline."""
    async with gateway(tmp_path, **EMBEDDED, mqtt_keepalive_interval=None) as run:
        reply = await ota_check_in(run)
        device = stock_device(reply)
        device.idle_close = SILENCE_LIMIT
        async with device, run.gateway.registry.device_changes() as changes:
            await wait_listed(run, STOCK)
            async with asyncio.timeout(bound(10)):
                await device.gave_up.wait()
            listed = run.gateway.registry.find(STOCK)
            assert listed is not None
            await until(changes, lambda: not listed.online)


@pytest.mark.anyio
async def test_a_busy_device_gets_no_pings(tmp_path: Path) -> None:
    """Calls more often than the interval are traffic enough: no ping is added."""
    async with gateway(tmp_path, **EMBEDDED, mqtt_keepalive_interval=bound(0.6)) as run:
        reply = await ota_check_in(run)
        async with stock_device(reply) as device:
            await wait_listed(run, STOCK)
            session = run.gateway.registry.find(STOCK).session  # type: ignore[union-attr]
            assert session is not None
            for _ in range(8):  # 8 x 0.2 intervals: past two intervals in all
                await session.call("self.get_device_status", {})
                await asyncio.sleep(bound(0.6) / 5)
            assert pings(device.received) == 0


@pytest.mark.parametrize(
    ("file", "env", "expected"),
    [
        ("", {}, 60.0),  # on by default
        ("[mqtt]\nkeepalive_interval = 0\n", {}, None),
        ("[mqtt]\nkeepalive_interval = 20\n", {"GATEWAY_MQTT_KEEPALIVE_INTERVAL": "off"}, None),
        ("", {"GATEWAY_MQTT_KEEPALIVE_INTERVAL": "45"}, 45.0),
    ],
)
def test_keepalive_interval_from_file_and_environment(
    tmp_path: Path, file: str, env: dict[str, str], expected: float | None
) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(file)
    assert load_config(path, env=env).mqtt_keepalive_interval == expected


def test_a_negative_keepalive_interval_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text("[mqtt]\nkeepalive_interval = -5\n")
    with pytest.raises(ConfigError, match="mqtt.keepalive_interval"):
        load_config(path, env={})
