"""The default catalogue: stock order and shapes, state kept per board, three pages."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from device_fw.fw_envelope import dumps
from gateway.simulator import BoardState, DeviceMcpServer, DeviceReboot, default_tools

pytestmark = pytest.mark.anyio

USER_ONLY = ["self.get_system_info", "self.reboot", "self.upgrade_firmware"]


async def call(server: DeviceMcpServer, name: str, **arguments: Any) -> Any:
    """Call a tool; return its text, or the error message."""
    params = {"name": name, "arguments": arguments}
    reply = await server.handle(
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    )
    assert reply is not None
    if "error" in reply:
        return reply["error"]["message"]
    return reply["result"]["content"][0]["text"]


def test_catalogue_order_size_and_user_only_tools() -> None:
    """Common tools first, user-only last; 12-20 tools, unique names, three pages' worth."""
    tools = default_tools()
    names = [t.name for t in tools]
    assert 12 <= len(tools) <= 20 and len(set(names)) == len(names)
    assert names[:2] == ["self.get_device_status", "self.audio_speaker.set_volume"]
    assert [t.name for t in tools if t.user_only] == names[-3:] == USER_ONLY
    size = sum(len(dumps(t.to_json()).encode()) for t in tools)
    assert 2 * 8000 < size < 3 * 7000


def test_stock_schemas_are_kept() -> None:
    """set_volume and upgrade_firmware list exactly like stock (the url default bug included)."""
    tools = {t.name: t.to_json() for t in default_tools()}
    assert tools["self.audio_speaker.set_volume"]["inputSchema"] == {
        "type": "object",
        "properties": {"volume": {"type": "integer", "minimum": 0, "maximum": 100}},
        "required": ["volume"],
    }
    upgrade = tools["self.upgrade_firmware"]["inputSchema"]
    assert "required" not in upgrade
    assert upgrade["properties"]["url"]["default"].startswith("The URL of the firmware")


async def test_lamp_state_is_kept_between_calls() -> None:
    """A value set by one call is read back by another, and shows in the device status."""
    server = DeviceMcpServer(default_tools())
    assert await call(server, "self.lamp.get_state") == '{"power":false}'
    assert await call(server, "self.lamp.turn_on") == "true"
    assert await call(server, "self.lamp.get_state") == '{"power":true}'
    assert await call(server, "self.audio_speaker.set_volume", volume=30) == "true"
    status = json.loads(await call(server, "self.get_device_status"))
    assert status["lamp"] == {"power": True} and status["audio_speaker"] == {"volume": 30}
    assert isinstance(status["uptime"], int) and isinstance(status["chip"]["temperature"], float)
    assert await call(server, "self.lamp.turn_off") == "true"
    assert await call(server, "self.lamp.get_state") == '{"power":false}'


async def test_each_board_has_its_own_state() -> None:
    """Two catalogues do not share a lamp."""
    one, two = DeviceMcpServer(default_tools()), DeviceMcpServer(default_tools())
    await call(one, "self.lamp.turn_on")
    assert await call(two, "self.lamp.get_state") == '{"power":false}'


async def test_temperature_is_a_plausible_drifting_number() -> None:
    """Readings are decimal text in 18..32 °C and move by at most 0.3 °C per reading."""
    server = DeviceMcpServer(default_tools(BoardState(rng=random.Random(7))))
    readings = [float(await call(server, "self.sensor.read_temperature")) for _ in range(50)]
    assert all(18.0 <= r <= 32.0 for r in readings)
    assert all(abs(a - b) <= 0.31 for a, b in zip(readings, readings[1:], strict=False))
    assert len(set(readings)) > 1


async def test_relays_gpio_led_and_theme() -> None:
    """Relays and pins keep their state; reserved pins and bad themes are refused."""
    server = DeviceMcpServer(default_tools())
    assert await call(server, "self.relay.set", channel=2, on=True) == "true"
    relays = json.loads(await call(server, "self.relay.get_states"))["relays"]
    assert relays[1] == {"channel": 2, "on": True} and len(relays) == 4
    assert await call(server, "self.relay.set", channel=5, on=True) == (
        "Value exceeds maximum allowed: 4"
    )
    assert await call(server, "self.relay.pulse", channel=1, duration_ms=50) == "true"
    assert await call(server, "self.gpio.set_level", pin=2, level=True) == "true"
    assert await call(server, "self.gpio.get_level", pin=2) == "true"
    assert await call(server, "self.gpio.get_level", pin=3) == "false"
    assert "reserved" in await call(server, "self.gpio.set_level", pin=30, level=True)
    assert await call(server, "self.led_strip.set_color", r=1, g=2, b=3) == "true"
    assert await call(server, "self.screen.set_theme", theme="purple") == "false"
    assert await call(server, "self.screen.set_theme", theme="dark") == "true"
    assert await call(server, "self.screen.set_brightness", brightness=5) == "true"
    status = json.loads(await call(server, "self.get_device_status"))
    assert status["screen"] == {"brightness": 5, "theme": "dark"}
    assert await call(server, "self.screen.show_message", text="hi") == "true"


async def test_slow_wait_uses_its_default_range() -> None:
    """seconds defaults to 2, allows 0..60; zero answers at once."""
    server = DeviceMcpServer(default_tools())
    assert await call(server, "self.slow.wait", seconds=0) == "Waited 0 seconds"
    assert await call(server, "self.slow.wait", seconds=61) == "Value exceeds maximum allowed: 60"
    schema = {t.name: t.to_json() for t in server.tools}["self.slow.wait"]["inputSchema"]
    assert schema["properties"]["seconds"] == {
        "type": "integer", "default": 2, "minimum": 0, "maximum": 60
    }  # fmt: skip


@pytest.mark.parametrize(
    "name", ["self.reboot", "self.upgrade_firmware", "self.system.reconfigure_wifi"]
)
async def test_rebooting_tools_lose_ram_state_and_never_reply(name: str) -> None:
    """Like stock, the reboot happens before the reply: RAM state goes, NVS settings stay."""
    board = BoardState()
    server = DeviceMcpServer(default_tools(board))
    await call(server, "self.lamp.turn_on")
    await call(server, "self.audio_speaker.set_volume", volume=10)
    with pytest.raises(DeviceReboot):
        await call(server, name)
    assert board.lamp_on is False and board.volume == 10


async def test_system_info_describes_the_board() -> None:
    """get_system_info is the OTA body: MAC, UUID, board, firmware version."""
    board = BoardState(device_id="02:00:00:00:00:07", board="sim-esp32")
    info = json.loads(await call(DeviceMcpServer(default_tools(board)), "self.get_system_info"))
    assert info["mac_address"] == "02:00:00:00:00:07" and info["uuid"] == board.client_id
    assert info["application"]["version"] == "2.4.2"
