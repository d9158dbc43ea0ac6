"""The owner's limits on arguments and rates per caller: refused before the device, audited.

A raw stock-like device on a real WebSocket records every call it gets; a real gateway on
uvicorn loads its ``[devices."<id>"]`` table from TOML with the real loader; MCP SDK clients
(streamable HTTP) list and call its tools.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import httpx2
import mcp.types as types
import pytest
from mcp import Client

from gateway.config import DeviceOptions, load_config
from tests.conftest import gateway
from tests.e2e.helpers import RawDevice, serving

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

JsonObject = dict[str, Any]

VOLUME = "self.audio_speaker.set_volume"
HEATER = "self.heater.set_level"
RELAY = "self.relay.set_state"
TOOLS: list[JsonObject] = [
    {
        "name": VOLUME,
        "description": "Set the speaker volume",
        "inputSchema": {
            "type": "object",
            "properties": {"volume": {"type": "integer", "minimum": 0, "maximum": 100}},
            "required": ["volume"],
        },
    },
    {
        "name": HEATER,
        "description": "Set the heater level",
        "inputSchema": {
            "type": "object",
            "properties": {"level": {"type": "integer", "minimum": 0, "maximum": 5}},
        },
    },
    {
        "name": RELAY,
        "description": "Switch the relay",
        "inputSchema": {"type": "object", "properties": {"on": {"type": "boolean"}}},
    },
]
DEVICE_ID = "aa:bb:cc:dd:ee:45"
CONFIG = f"""
[devices."{DEVICE_ID}"]
name = "kitchen"
limits = {{ "self.audio_speaker.set_volume" = {{ volume = {{ maximum = 60 }} }}, \
"heater.set_level" = {{ level = {{ maximum = 9 }} }} }}
rate = {{ "self.relay.*" = "6/minute" }}
"""


def devices(tmp_path: Path) -> dict[str, DeviceOptions]:
    """The devices table of CONFIG, read by the real config loader."""
    path = tmp_path / "gateway.toml"
    path.write_text(CONFIG)
    return dict(load_config(path, env={"GATEWAY_DATA_DIR": str(tmp_path / "data")}).devices)


def text_of(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


def audited(tmp_path: Path) -> list[JsonObject]:
    lines = (tmp_path / "audit.log").read_text().splitlines()
    return [json.loads(line) for line in lines]


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_call_outside_the_owner_s_limit_never_reaches_the_device(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """80 against a maximum of 60 is refused naming the limit, the board never sees it, 50
    passes; tools/list shows the maximum; a limit wider than the device's refuses its tool."""
    device = RawDevice(DEVICE_ID, "kitchen", TOOLS)
    caplog.set_level(logging.WARNING, "gateway.devices.limits")
    async with (
        gateway(tmp_path, devices=devices(tmp_path)) as run,
        serving(run, device),
        Client(run.mcp_url, mode="legacy") as client,
    ):
        listed = {t.name: t for t in (await client.list_tools()).tools}
        loud = await client.call_tool(device.mcp_name(VOLUME), {"volume": 80})
        calls_after_refusal = list(device.calls)
        quiet = await client.call_tool(device.mcp_name(VOLUME), {"volume": 50})
        heater = await client.call_tool(
            "call_device_tool", {"device": "kitchen", "tool": HEATER, "arguments": {"level": 1}}
        )
    volume = listed[device.mcp_name(VOLUME)].input_schema["properties"]["volume"]
    assert volume == {"type": "integer", "minimum": 0, "maximum": 60}
    assert loud.is_error and calls_after_refusal == []
    assert "volume 80 is above the owner's limit of 60" in text_of(loud)
    assert not quiet.is_error and device.calls == [(VOLUME, {"volume": 50})]
    # the widening limit: the tool is served to no one, with the reason, said in the log too
    assert device.mcp_name(HEATER) not in listed
    reason = "level: maximum 9 is wider than the device's own maximum of 5"
    assert heater.is_error and reason in text_of(heater)
    assert any(reason in r.getMessage() for r in caplog.records)
    refused = [r for r in audited(tmp_path) if r["outcome"] == "rejected"]
    assert [r["tool"] for r in refused] == [VOLUME, HEATER]
    assert all(r["caller"].startswith("http:127.0.0.1") for r in refused)


async def test_a_caller_over_its_rate_waits_and_each_caller_has_its_own(tmp_path: Path) -> None:
    """6/minute: the 7th call is refused with the wait and never sent, another host and the
    person (the JSON API) still get through, and once the clock has moved a minute the first
    caller does again."""
    device = RawDevice(DEVICE_ID, "kitchen", TOOLS)
    tablet = types.Implementation(name="tablet", version="1.0")
    phone = types.Implementation(name="phone", version="1.0")
    clock = Clock()
    name = device.mcp_name(RELAY)
    async with (
        gateway(tmp_path, devices=devices(tmp_path)) as run,
        serving(run, device),
        Client(run.mcp_url, mode="legacy", client_info=tablet) as first,
        Client(run.mcp_url, mode="legacy", client_info=phone) as second,
    ):
        run.gateway.router.rates.clock = clock
        for _ in range(6):
            assert not (await first.call_tool(name, {"on": True})).is_error
        clock.now += 52
        over = await first.call_tool(name, {"on": False})
        sent_before_other = len(device.calls)
        other = await second.call_tool(name, {"on": False})
        async with httpx2.AsyncClient() as http:
            call = {"device": "kitchen", "tool": RELAY, "arguments": {"on": False}}
            person = await http.post(f"http://127.0.0.1:{run.host_port}/api/call", json=call)
        clock.now += 8
        again = await first.call_tool(name, {"on": False})
    assert over.is_error and sent_before_other == 6
    assert text_of(over) == (
        f"{RELAY} is limited to 6 calls a minute for each caller; try again in 8 s"
    )
    assert not other.is_error and not again.is_error and person.status_code == 200
    assert device.calls[6:] == [(RELAY, {"on": False})] * 3
    [refused] = [r for r in audited(tmp_path) if r["outcome"] == "rejected"]
    assert refused["caller"] == "http:127.0.0.1 tablet" and refused["tool"] == RELAY
