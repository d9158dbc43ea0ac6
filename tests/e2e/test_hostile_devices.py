"""Hostile device catalogues: each bad tool is rejected alone; the rest of the gateway carries on.

Raw stock-like devices on real WebSockets, a real gateway, and an SDK client over streamable HTTP.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp.types as types
import pytest
from mcp import Client

from tests.conftest import bound, gateway
from tests.e2e.helpers import RawDevice, aliases, listed_device, serving

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

JsonObject = dict[str, Any]

GOOD_DEVICE = "02:00:00:00:00:01"  # the simulated board of listed_device()
GOOD_DEVICE_TOOL = "sim-esp32_0001_lamp_turn_on"

PING = "self.good.ping"
PING_TOOL = {
    "name": PING,
    "description": "Answer pong.",
    "inputSchema": {"type": "object", "properties": {}},
}


def nested_schema(depth: int) -> JsonObject:
    """An object schema whose ``properties -> a -> properties -> a ...`` chain is ``depth`` long."""
    schema: JsonObject = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


# One bad tool per kind of hostility; each goes on its own device, before PING_TOOL.
BAD_TOOLS: dict[str, JsonObject] = {
    # Sent escaped ("\udc00"): a lone surrogate cannot travel as UTF-8.
    "surrogate": {
        "name": "self.bad.surrogate",
        "description": "Broken \udc00 text.",
        "inputSchema": {"type": "object", "properties": {}},
    },
    "properties": {
        "name": "self.bad.properties",
        "description": "Properties that are not an object.",
        "inputSchema": {"type": "object", "properties": "nope"},
    },
    "required": {
        "name": "self.bad.required",
        "description": "Required that is not a list.",
        "inputSchema": {"type": "object", "properties": {}, "required": 5},
    },
    "deep": {
        "name": "self.bad.deep",
        "description": "A schema nested 200 levels deep.",
        "inputSchema": nested_schema(200),
    },
}

WORD_CHECK = "self.word.check"
WORD_CHECK_TOOL = {
    "name": WORD_CHECK,
    "description": "Check a word of a's.",
    "inputSchema": {
        "type": "object",
        "properties": {"text": {"type": "string", "pattern": "^(a+)+$"}},
        "required": ["text"],
    },
}
# Backtracking engines take seconds on this (about 2**30 ways to split the a's).
CATASTROPHIC_TEXT = "a" * 30 + "!"


def hostile_device(kind: str, number: int = 0x10, *, page_size: int = 16) -> RawDevice:
    """A device aliased ``kind`` that lists the bad tool of ``kind`` and then PING_TOOL."""
    tools = [BAD_TOOLS[kind], PING_TOOL]
    return RawDevice(f"aa:bb:cc:dd:ee:{number:02x}", kind, tools, page_size)


def all_hostile_devices() -> list[RawDevice]:
    """One device per kind of bad tool; the deep one lists a tool a page (two pages)."""
    return [
        hostile_device(kind, 0x10 + i, page_size=1 if kind == "deep" else 16)
        for i, kind in enumerate(BAD_TOOLS)
    ]


def bad_names(names: list[str]) -> list[str]:
    """The names, among ``names``, of bad tools (every bad tool is called ``self.bad.*``)."""
    return [name for name in names if "_bad_" in name]


def listed_devices(result: types.CallToolResult) -> dict[str, JsonObject]:
    """The devices of a ``list_devices`` result, by id."""
    assert not result.is_error
    assert isinstance(result.content[0], types.TextContent)
    return {d["id"]: d for d in json.loads(result.content[0].text)["devices"]}


@pytest.mark.parametrize("kind", list(BAD_TOOLS))
async def test_bad_tool_is_rejected_and_the_rest_is_served(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    """The bad tool is left out with one log line; its device's good tool and others' work."""
    caplog.set_level(logging.INFO)
    hostile = hostile_device(kind)
    async with (
        gateway(tmp_path, devices=aliases(hostile)) as run,
        listed_device(run) as good,
        serving(run, hostile),
        Client(run.mcp_url, mode="legacy") as client,
    ):
        names = [t.name for t in (await client.list_tools()).tools]
        lamp = await client.call_tool(GOOD_DEVICE_TOOL, {})
        ping = await client.call_tool(hostile.mcp_name(PING), {})
    assert bad_names(names) == []
    assert GOOD_DEVICE_TOOL in names and hostile.mcp_name(PING) in names
    assert not lamp.is_error and [name for name, _ in good.calls] == ["self.lamp.turn_on"]
    assert not ping.is_error and hostile.calls == [(PING, {})]
    bad_tool = BAD_TOOLS[kind]["name"]
    lines = [r for r in caplog.records if r.levelno >= logging.INFO and bad_tool in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]


async def test_list_devices_shows_each_rejected_tool_with_a_reason(tmp_path: Path) -> None:
    """Each hostile device shows its bad tool under rejected, with a reason; others show none."""
    hostiles = all_hostile_devices()
    async with (
        gateway(tmp_path, devices=aliases(*hostiles)) as run,
        listed_device(run),
        serving(run, *hostiles),
        Client(run.mcp_url, mode="legacy") as client,
    ):
        devices = listed_devices(await client.call_tool("list_devices", {}))
    for hostile in hostiles:
        device = devices[hostile.device_id]
        rejected = device["rejected"]
        assert [r["tool"] for r in rejected] == [hostile.tools[0]["name"]], device
        assert all(isinstance(r["reason"], str) and r["reason"] for r in rejected), rejected
        assert [t["tool"] for t in device["tools"]] == [PING]
    assert not devices[GOOD_DEVICE].get("rejected")
    assert devices[GOOD_DEVICE]["tools"]


async def test_catastrophic_pattern_is_refused_at_once_without_blocking(tmp_path: Path) -> None:
    """A device's ``^(a+)+$`` runs in linear time: a prompt mismatch error; /healthz answers."""
    device = RawDevice("aa:bb:cc:dd:ee:20", "words", [WORD_CHECK_TOOL, PING_TOOL])
    async with (
        gateway(tmp_path, devices=aliases(device)) as run,
        serving(run, device),
        Client(run.mcp_url, mode="legacy") as client,
        httpx2.AsyncClient() as http,
    ):
        assert device.mcp_name(WORD_CHECK) in [t.name for t in (await client.list_tools()).tools]
        answers: list[types.CallToolResult] = []
        done = anyio.Event()

        async def call() -> None:
            with anyio.move_on_after(bound(5)):
                answers.append(
                    await client.call_tool(device.mcp_name(WORD_CHECK), {"text": CATASTROPHIC_TEXT})
                )
            done.set()

        health = [f"http://127.0.0.1:{port}/healthz" for port in (run.device_port, run.host_port)]
        slowest = 0.0
        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            # Every await of this loop is a bounded health check: a blocked event loop (the
            # gateway runs in this one) delays whichever check is waiting.
            while not done.is_set():
                for url in health:
                    asked = time.monotonic()
                    with anyio.fail_after(bound(1)):
                        response = await http.get(url)
                    slowest = max(slowest, time.monotonic() - asked)
                    assert response.status_code == 200
        elapsed = time.monotonic() - started
    assert slowest < bound(1), f"a /healthz answer took {slowest:.1f} s"
    assert answers and elapsed < bound(2), f"no answer after {elapsed:.1f} s"
    [result] = answers
    assert result.is_error and isinstance(result.content[0], types.TextContent)
    message = result.content[0].text
    assert "text" in message and "match" in message.lower(), message  # names the argument
    assert device.calls == []  # refused by the gateway: the device never sees it


async def test_restart_keeps_good_tools_listed_and_bad_ones_out(tmp_path: Path) -> None:
    """On the same data dir, tools/list works and offline devices keep only their good tools."""
    hostiles = all_hostile_devices()
    config = aliases(*hostiles)
    async with gateway(tmp_path, devices=config) as run, listed_device(run):
        async with serving(run, *hostiles):
            pass
    async with (
        gateway(tmp_path, devices=config) as run,
        Client(run.mcp_url, mode="legacy") as client,
    ):
        names = [t.name for t in (await client.list_tools()).tools]
        devices = listed_devices(await client.call_tool("list_devices", {}))
    assert bad_names(names) == []
    assert GOOD_DEVICE_TOOL in names  # offline_tools = "keep"
    assert {h.mcp_name(PING) for h in hostiles} <= set(names)
    for hostile in hostiles:
        device = devices[hostile.device_id]
        assert device["online"] is False
        assert [t["tool"] for t in device["tools"]] == [PING]
