"""The firmware's own tools (fw_tools) on the simulated board."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import jsonschema_rs
import pytest

from device_fw.fw_board import SimBoard
from device_fw.fw_config import DEFAULTS, merge
from device_fw.fw_mcp import McpServer, ToolError
from device_fw.fw_tools import default_tools, parse_colour, signal
from tests.conftest import bound
from tests.device_fw.conftest import TESTS, run_on_micropython

sys.path.append(str(TESTS))  # tools_scenario imports the firmware by its board names
import tools_scenario  # noqa: E402

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


# Rich results (MCP 2025-06-18): outputSchema + structuredContent, titles and hints.
# tests/device_fw/tools_scenario.py lists the tools and calls each one that declares a schema.

STRUCTURED = {"self.get_device_status", "self.fan.get_state", "self.led.get_state",
              "self.adc.read", "self.chip.get_temperature", "self.neopixel.set_color"}  # fmt: skip


def scenario_on_micropython(page_limit: int = 8000) -> Any:
    return json.loads(run_on_micropython("tools_scenario.py", str(page_limit)).splitlines()[-1])


def scenario_on_cpython(page_limit: int = 8000) -> Any:
    return asyncio.run(tools_scenario.collect(page_limit))


RUNTIMES = [scenario_on_cpython, scenario_on_micropython]
RUNTIME_IDS = ["cpython", "micropython"]


@pytest.mark.parametrize("scenario", RUNTIMES, ids=RUNTIME_IDS)
def test_object_results_match_their_output_schema(scenario: Any) -> None:
    """Every tool that returns an object declares a valid outputSchema; its result carries the
    object as structuredContent, which the schema accepts, and as JSON text for older clients."""
    seen = scenario()
    (page,) = seen["pages"]
    declared = {
        tool["name"]: tool["outputSchema"] for tool in page["tools"] if "outputSchema" in tool
    }
    assert set(declared) == set(seen["results"]) == STRUCTURED
    for name, schema in declared.items():
        jsonschema_rs.meta.validate(schema)
        result = seen["results"][name]
        structured = result["structuredContent"]
        jsonschema_rs.validate(schema, structured)
        assert [item["type"] for item in result["content"]] == ["text"], name
        assert json.loads(result["content"][0]["text"]) == structured, name
        assert result["isError"] is False
    status = seen["results"]["self.get_device_status"]["structuredContent"]
    assert status["outputs"] == {"led": False, "fan": False}


@pytest.mark.parametrize("scenario", RUNTIMES, ids=RUNTIME_IDS)
def test_every_tool_has_a_title_and_fitting_hints(scenario: Any) -> None:
    """Readers say readOnlyHint; setters are idempotent and not destructive; reboot is
    destructive and stays user-only (audience ["user"])."""
    (page,) = scenario()["pages"]
    hints = {tool["name"]: tool["annotations"] for tool in page["tools"]}
    assert all(isinstance(h.get("title"), str) and h["title"] for h in hints.values()), hints
    readers = {name for name, h in hints.items() if h.get("readOnlyHint") is True}
    assert readers == STRUCTURED - {"self.neopixel.set_color"}
    for name in ("self.led.set_power", "self.fan.set_power", "self.neopixel.set_color"):
        assert hints[name]["destructiveHint"] is False and hints[name]["idempotentHint"] is True
    assert hints["self.reboot"] == {
        "title": "Reboot", "readOnlyHint": False, "destructiveHint": True, "audience": ["user"]
    }  # fmt: skip


@pytest.mark.parametrize("scenario", RUNTIMES, ids=RUNTIME_IDS)
def test_schemas_count_towards_the_page_limit(scenario: Any) -> None:
    """With a small page limit the tools, schemas and all, spread over pages that each stay
    within it (stock's rule: tools + 30 bytes of slack), in registration order."""
    limit = 2000
    pages = scenario(limit)["pages"]
    assert len(pages) > 2
    for page in pages:
        assert len(json.dumps(page, ensure_ascii=False, separators=(",", ":")).encode()) <= limit
    listed = [tool["name"] for page in pages for tool in page["tools"]]
    assert listed == [tool.name for tool in default_tools(board())]
    for before, after in zip(pages, pages[1:], strict=False):
        assert before["nextCursor"] == after["tools"][0]["name"]
