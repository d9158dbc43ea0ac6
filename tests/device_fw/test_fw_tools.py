"""The firmware's own tools (fw_tools) on the simulated board."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from device_fw.fw_board import SimBoard
from device_fw.fw_config import DEFAULTS, merge
from device_fw.fw_mcp import McpServer, ToolError
from device_fw.fw_tools import default_tools, parse_colour, signal
from tests.conftest import bound

pytestmark = pytest.mark.anyio


def board(**pins: Any) -> SimBoard:
    return SimBoard(merge(DEFAULTS, {"pins": {"outputs": {"led": 2, "fan": 4}, **pins}}))


async def call(server: McpServer, name: str, **arguments: Any) -> Any:
    params = {"name": name, "arguments": arguments}
    reply = await server.handle({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                 "params": params})  # fmt: skip
    assert reply is not None
    if "error" in reply:
        return reply["error"]
    text = reply["result"]["content"][0]["text"]
    return json.loads(text) if text[:1] in "{[" else text


def serve(sim: SimBoard) -> McpServer:
    server = McpServer(sim.name, "0.1.0")
    for tool in default_tools(sim):
        server.add(tool)
    return server


def test_the_default_catalogue_follows_the_board() -> None:
    """Status, two tools per output (sorted), ADC, temperature, NeoPixel, user-only reboot."""
    names = [tool.name for tool in default_tools(board())]
    assert names == [
        "self.get_device_status",
        "self.fan.set_power", "self.fan.get_state",
        "self.led.set_power", "self.led.get_state",
        "self.adc.read", "self.chip.get_temperature", "self.neopixel.set_color", "self.reboot",
    ]  # fmt: skip
    assert [t.name for t in default_tools(board()) if t.user] == ["self.reboot"]


async def test_outputs_switch_and_read_back_in_the_status() -> None:
    """set_power changes get_state and the status document's outputs."""
    sim = board()
    server = serve(sim)
    assert await call(server, "self.fan.set_power", on=True) == "true"
    assert await call(server, "self.fan.get_state") == {"on": True}
    status = await call(server, "self.get_device_status")
    assert status["outputs"] == {"led": False, "fan": True}
    assert status["network"] == {"type": "wifi", "rssi": -55, "signal": "strong"}
    assert status["firmware"] == "0.1.0" and status["uptime_s"] >= 0


async def test_sensors_give_plausible_readings() -> None:
    """The simulated ADC stays within 0..3.3 V and the chip between 30 and 55 °C."""
    server = serve(board(adc=36))
    adc = await call(server, "self.adc.read")
    assert adc["pin"] == 36 and 0 <= adc["raw"] <= 65535 and 0 <= adc["volts"] <= 3.3
    celsius = (await call(server, "self.chip.get_temperature"))["celsius"]
    assert 30 <= celsius <= 55


async def test_neopixel_takes_names_and_hex_scaled_by_brightness() -> None:
    """Names and #rrggbb set the pixel (scaled by brightness); anything else is refused."""
    sim = board()
    server = serve(sim)
    assert await call(server, "self.neopixel.set_color", color="Red", brightness=50) == {
        "rgb": [127, 0, 0]
    }
    assert sim.pixel == (127, 0, 0)
    refused = await call(server, "self.neopixel.set_color", color="#12345")
    assert refused["code"] == -32602 and "Unknown colour '#12345'" in refused["message"]
    assert parse_colour(" 00ff80 ") == (0, 255, 128)
    with pytest.raises(ToolError):
        parse_colour("zzzzzz")


async def test_reboot_answers_first_then_resets_the_board() -> None:
    """self.reboot replies, then the board reboots: RAM state gone, the runtime told."""
    sim = board()
    rebooted = asyncio.Event()
    sim.on_reboot = rebooted.set
    server = serve(sim)
    await call(server, "self.led.set_power", on=True)
    assert await call(server, "self.reboot") == "Rebooting"
    async with asyncio.timeout(bound(5)):
        await rebooted.wait()
    assert sim.levels == {"led": False, "fan": False}


def test_signal_words_follow_stock() -> None:
    """strong from -60 dBm, medium from -70, weak below, None without Wi-Fi."""
    assert [signal(r) for r in (-50, -60, -65, -71, None)] == [
        "strong", "strong", "medium", "weak", None
    ]  # fmt: skip
