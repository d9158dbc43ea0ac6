"""Large fleets: paged ``tools/list`` and ``list_devices``, and grouped tools above the budget.

Raw stock-like devices on real WebSockets, a real gateway, and an SDK client over streamable HTTP.
"""

from __future__ import annotations

import json
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import mcp.types as types
import pytest
from mcp import Client

from tests.conftest import gateway
from tests.e2e.helpers import RawDevice, aliases, listed_device, serving

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

JsonObject = dict[str, Any]

META_TOOLS = ["list_devices", "call_device_tool", "wait_for_event", "notify_device"]
MOST_BYTES = 256 * 1024  # every answer a host gets stays under this, whatever the fleet

# What each component is, in the words its tool descriptions use.
COMPONENTS = {
    "lamp": "the dimmable LED ceiling lamp over the workbench (24 V, PWM driven)",
    "fan": "the extractor fan of the soldering enclosure (4-pin PWM, tachometer read back)",
    "heater": "the silicone heating pad under the seedling tray (mains, through a relay)",
    "blinds": "the motorised roller blind of the east window (stepper with an end switch)",
    "valve": "the garden irrigation valve on the rain-water tank (12 V solenoid, latching)",
}
LEVEL = {"type": "integer", "minimum": 0, "maximum": 100}
# The usage notes firmware authors append to every description (stock boards write such prose).
USAGE = (
    " Safe to call repeatedly: the device applies the latest command and answers in plain text."
    " A refused command says why (out of range, locked by set_limits, calibrating, or a fault"
    " latched since the last reset), and nothing changes then. Use get_state first if unsure"
    " what the component is doing: commands sent while it calibrates are refused, not queued."
    " Every command is written to the device's own log with the time it arrived."
)


def prop(schema: JsonObject, text: str) -> JsonObject:
    """A property schema with a description as long as firmware authors write them."""
    return {**schema, "description": text + " Out-of-range values are refused by the device."}


# Each action: what it does, its properties, what it requires, and valid arguments for a call.
ACTIONS: dict[str, tuple[str, JsonObject, list[str], JsonObject]] = {
    "get_state": (
        "Read the current state of {what}: its level in percent, whether it is running, how long "
        "it has run today, and the last fault it reported, if any.",
        {
            "fields": prop(
                {"type": "array", "items": {"enum": ["level", "running", "runtime", "fault"]}},
                "Which fields to read; leave it out to read them all in one go.",
            ),
            "include_history": prop(
                {"type": "boolean"}, "Also return the level sampled once a minute, newest last."
            ),
            "history_minutes": prop(
                {"type": "integer", "minimum": 1, "maximum": 1440},
                "How many minutes of history to return when include_history is true.",
            ),
        },
        [],
        {"fields": ["level"]},
    ),
    "set_level": (
        "Set {what} to a level between 0 (off) and 100 (full), optionally fading over a given "
        "time so that nobody is startled. The device answers once the new level is reached.",
        {
            "level": prop(LEVEL, "The level to reach, in percent of the full range."),
            "transition_ms": prop(
                {"type": "integer", "minimum": 0, "maximum": 60000},
                "How long the change should take, in milliseconds; 0 changes it at once.",
            ),
            "reason": prop(
                {"type": "string", "maxLength": 200},
                "A short note kept in the device's own log, e.g. who asked for the change.",
            ),
        },
        ["level"],
        {"level": 40},
    ),
    "schedule": (
        "Plan a change of {what} for later: at the given local time the device sets the level "
        "by itself, even if the gateway is unreachable then. Up to 16 plans are kept.",
        {
            "at": prop(
                {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"},
                "The local time of day, as HH:MM on the 24-hour clock of the device.",
            ),
            "level": prop(LEVEL, "The level to set at that time, in percent of the full range."),
            "repeat": prop(
                {"enum": ["once", "daily", "weekdays", "weekends"]},
                "Whether the plan runs once or repeats on the given days.",
            ),
            "label": prop(
                {"type": "string", "maxLength": 40},
                "A name for the plan, so that it can be listed and removed later.",
            ),
        },
        ["at", "level"],
        {"at": "07:30", "level": 80},
    ),
    "calibrate": (
        "Calibrate {what}: the quick mode checks the end points only, the full mode sweeps the "
        "whole range and takes about a minute, during which other commands are refused.",
        {
            "mode": prop({"enum": ["quick", "full"]}, "Which calibration to run."),
            "reference": prop(
                {"type": "number"},
                "A reference reading taken by hand (in the component's own unit), if any.",
            ),
            "confirm": prop(
                {"type": "boolean", "const": True},
                "Must be true: calibrating moves or powers the component on its own.",
            ),
        },
        ["confirm"],
        {"confirm": True},
    ),
    "set_limits": (
        "Set the safety limits of {what}: the lowest and highest level it may be set to and the "
        "longest it may run without a new command. Limits survive a reboot of the device.",
        {
            "min_level": prop(LEVEL, "The lowest level allowed, in percent; 0 allows off."),
            "max_level": prop(LEVEL, "The highest level allowed, in percent."),
            "max_runtime_s": prop(
                {"type": "integer", "minimum": 0, "maximum": 86400},
                "The longest run without a new command, in seconds; 0 means no limit.",
            ),
            "lock": prop(
                {"type": "boolean"}, "Keep these limits until they are set again with lock false."
            ),
        },
        ["max_level"],
        {"max_level": 90},
    ),
}


def device_tool(component: str, action: str) -> JsonObject:
    """The tool entry ``self.<component>.<action>``, about 1.5 KB as a device lists it."""
    text, properties, required, _ = ACTIONS[action]
    what = COMPONENTS[component]
    description = text.format(what=what) + USAGE
    schema = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    return {"name": f"self.{component}.{action}", "description": description, "inputSchema": schema}


def catalogue(components: list[str], actions: list[str]) -> list[JsonObject]:
    """One tool per component and action, components first."""
    return [device_tool(c, a) for c in components for a in actions]


def fleet(count: int, tools: list[JsonObject], prefix: str) -> list[RawDevice]:
    """``count`` raw devices serving ``tools`` in stock-sized pages, named ``<prefix>-01``..."""
    return [
        RawDevice(f"aa:bb:cc:dd:{n >> 8:02x}:{n & 0xFF:02x}", f"{prefix}-{n:02d}", tools, 5)
        for n in range(1, count + 1)
    ]


def text_of(result: types.CallToolResult) -> str:
    """The text of a one-text-content result."""
    [content] = result.content
    assert isinstance(content, types.TextContent)
    return content.text


async def all_pages(client: Client) -> list[types.ListToolsResult]:
    """Every ``tools/list`` page, following ``next_cursor`` to the end."""
    pages = [await client.list_tools()]
    while pages[-1].next_cursor is not None:
        assert len(pages) < 100, "the cursors never end"
        pages.append(await client.list_tools(cursor=pages[-1].next_cursor))
    return pages


async def all_devices(client: Client, **filters: str) -> list[tuple[str, JsonObject]]:
    """Every ``list_devices`` answer as (text, parsed), following ``next_cursor`` to the end."""
    answers: list[tuple[str, JsonObject]] = []
    arguments: dict[str, str] = dict(filters)
    while True:
        result = await client.call_tool("list_devices", arguments)
        assert not result.is_error, result
        text = text_of(result)
        answers.append((text, json.loads(text)))
        cursor = answers[-1][1].get("next_cursor")
        if cursor is None:
            return answers
        assert len(answers) < 100, "the cursors never end"
        arguments = {**filters, "cursor": cursor}


def size(result: types.ListToolsResult) -> int:
    """The page's size on the wire, as the host receives it (about)."""
    return len(result.model_dump_json(by_alias=True, exclude_none=True).encode())


async def test_sixty_devices_page_every_tool_once_and_each_page_stays_small(
    tmp_path: Path,
) -> None:
    """60 devices x 25 tools: paged tools/list and list_devices, each answer under 256 KB."""
    tools = catalogue(list(COMPONENTS), list(ACTIONS))
    assert len(tools) == 25 and min(len(json.dumps(t)) for t in tools) > 1200  # pages fill
    devices = fleet(60, tools, "bench")
    async with (
        gateway(tmp_path, tools_mode="per-device", devices=aliases(*devices)) as run,
        serving(run, *devices),
        Client(run.mcp_url, mode="legacy") as client,
    ):
        pages = await all_pages(client)
        answers = await all_devices(client)
        filtered = await all_devices(client, name="bench-0*", state="online")
        by_name = {d.mcp_name(t["name"]): (d, t) for d in devices for t in d.tools}
        late = pages[-1].tools[-1].name  # the last device's last tool
        device, tool = by_name[late]
        arguments = ACTIONS[tool["name"].rsplit(".", 1)[1]][3]
        result = await client.call_tool(late, arguments)
    names = [t.name for page in pages for t in page.tools]
    assert len(pages) > 1
    assert [size(page) for page in pages if size(page) >= MOST_BYTES] == []
    assert [n for n, count in Counter(names).items() if count > 1] == []
    assert set(names) == {*META_TOOLS, *by_name} and len(names) == len(META_TOOLS) + 1500
    assert names[: len(META_TOOLS)] == META_TOOLS
    assert len(answers) > 1
    assert [len(text.encode()) for text, _ in answers if len(text.encode()) >= MOST_BYTES] == []
    listed = [d["id"] for _, answer in answers for d in answer["devices"]]
    assert sorted(listed) == sorted(d.device_id for d in devices)
    assert [d["device"] for _, answer in filtered for d in answer["devices"]] == [
        d.alias for d in devices[:9]
    ]
    assert not result.is_error and text_of(result) == f"{tool['name']} done"
    assert device.calls == [(tool["name"], arguments)]
    assert [d.alias for d in devices if d.calls] == [device.alias]


async def test_identical_devices_over_the_budget_share_one_tool_with_a_device_argument(
    tmp_path: Path,
) -> None:
    """Auto mode, 20 devices x 3 tools over a budget of 10: one tool each, routed by `device`."""
    tools = catalogue(["lamp"], ["get_state", "set_level"]) + [device_tool("fan", "set_level")]
    devices = fleet(20, tools, "shelf")
    seventh = devices[6]
    async with (
        gateway(tmp_path, tools_budget=10, devices=aliases(*devices)) as run,
        serving(run, *devices),
        Client(run.mcp_url, mode="legacy") as client,
    ):
        pages = await all_pages(client)
        on_seventh = await client.call_tool("lamp_set_level", {"device": "shelf-07", "level": 40})
        unknown = await client.call_tool("lamp_set_level", {"device": "shelf-99", "level": 40})
    [page] = pages
    listed = {t.name: t for t in page.tools}
    assert list(listed) == [*META_TOOLS, "lamp_get_state", "lamp_set_level", "fan_set_level"]
    schema = listed["lamp_set_level"].input_schema
    assert schema["required"] == ["device", "level"]
    assert schema["properties"]["device"]["enum"] == [d.alias for d in devices]
    assert not on_seventh.is_error and text_of(on_seventh) == "self.lamp.set_level done"
    assert seventh.calls == [("self.lamp.set_level", {"level": 40})]
    assert [d.alias for d in devices if d.calls] == ["shelf-07"]
    assert unknown.is_error
    assert "'shelf-99'" in text_of(unknown) and "lamp_set_level" in text_of(unknown)


async def test_devices_of_one_firmware_share_a_catalogue_found_by_their_raw_pages(
    tmp_path: Path,
) -> None:
    """Simulated devices frame their replies as stock firmware does: their catalogue is judged
    once, and found for the others by the digest of the raw pages, with no entry serialised
    again to hash it (the RawDevices above, spaced otherwise, take that slower way); their
    pages are parsed for the first device only, the others' found in the shared page book."""
    async with gateway(tmp_path) as run, AsyncExitStack() as stack:
        for n in range(1, 4):
            await stack.enter_async_context(listed_device(run, f"02:00:00:00:00:0{n}"))
        catalogues = run.gateway.registry.known.catalogues
        devices = run.gateway.registry.devices()
        assert len(devices) == 3 and len({id(d.catalogue) for d in devices}) == 1
        assert (catalogues.judged, catalogues.digests) == (1, 0)
        pages = run.gateway.registry.pages
        assert pages.found == 2 * len(pages) > 0
