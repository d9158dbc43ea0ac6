"""The simulator's events: the firmware's event API (device_fw/fw_events.py) on a clock the
test sets, read off the WebSocket as the device sends them."""

from __future__ import annotations

import pytest

from gateway.simulator import SimulatedDevice
from gateway.simulator.device import HOT
from tests.simulator.helpers import mini_gateway

pytestmark = pytest.mark.anyio


def params(message: dict[str, object]) -> object:
    assert message["type"] == "mcp" and message["session_id"] == "sess-1", message
    payload = message["payload"]
    assert isinstance(payload, dict) and payload["method"] == "notifications/message"
    assert payload["jsonrpc"] == "2.0" and "id" not in payload
    return payload["params"]


async def test_a_button_and_the_temperature_sensor_send_events_within_the_board_s_rate() -> None:
    """Five presses at once go (the burst), the sixth is dropped and counted; half a second on
    the board's clock lets one more go. The sensor sends its reading and, past HOT, its alarm."""
    now = [0]
    async with mini_gateway() as gw:
        device = SimulatedDevice(gw.url, None, clock=lambda: now[0])
        async with device:
            await gw.recv()  # its hello
            pressed = [device.press("boot") for _ in range(6)]
            now[0] += 500  # 2 a second: one more
            pressed.append(device.press("boot"))
            presses = [params(await gw.recv()) for _ in range(6)]
            dropped = device.events.dropped
            now[0] += 10_000  # the burst is back
            device.board.temperature = HOT + 1.5  # stays above HOT whatever it drifts by
            sent = device.sense()
            events = [params(await gw.recv()) for _ in range(sent)]
            assert device.sense() <= 1  # the alarm is not raised again while it stays hot
    assert pressed == [True] * 5 + [False, True] and dropped == 1
    assert presses == [{"level": "info", "logger": "button.boot", "data": {"event": "press"}}] * 6
    assert sent == 2
    reading, alarm = events
    assert reading["logger"] == "sensor.temperature" and reading["level"] == "info"  # type: ignore[index]
    assert reading["data"]["unit"] == "°C" and reading["data"]["value"] > HOT  # type: ignore[index]
    assert alarm["logger"] == "alarm.temperature" and alarm["level"] == "warning"  # type: ignore[index]
    assert alarm["data"]["state"] == "above" and alarm["data"]["limit"] == HOT  # type: ignore[index]
