"""Tests for gateway.host_side.tool_listing: pages under the size bound; cursors survive changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mcp.types as types
import pytest

from gateway.host_side.mcp_server import LIST_DEVICES
from gateway.host_side.tool_listing import PAGE_BYTES
from tests.conftest import make_config
from tests.fakes import ScriptedSession, Stack, tool

JsonObject = dict[str, Any]

TEXT = "Sets the thing. " * 30  # stock descriptions run long


def fleet(stack: Stack, count: int, tools: int = 25, first: int = 0) -> None:
    catalogue = tuple(
        {
            **tool(f"self.thing_{i}.set", level={"type": "integer", "minimum": 0}),
            "description": TEXT,
        }
        for i in range(tools)
    )
    for n in range(first, first + count):
        stack.registry.connect(f"aa:{n:04x}", ScriptedSession())
        stack.registry.set_catalogue(f"aa:{n:04x}", catalogue, {"name": "board"})


def page_bytes(tools: list[JsonObject]) -> int:
    result = types.ListToolsResult.model_validate({"tools": tools})  # as the SDK checks it
    return len(result.model_dump_json(by_alias=True, exclude_none=True))


def every_page(stack: Stack, cursor: str | None = None) -> list[list[JsonObject]]:
    pages = []
    while True:
        tools, cursor = stack.frontend.tools(cursor)
        pages.append(tools)
        if cursor is None:
            return pages


def test_sixty_devices_come_in_pages_under_the_bound(tmp_path: Path) -> None:
    """1,500 device tools: every one listed once, in order, every page far under 1 MiB."""
    stack = Stack(make_config(tmp_path, tools_mode="per-device"))
    fleet(stack, 60)
    pages = every_page(stack)
    names = [t["name"] for page in pages for t in page]
    assert len(pages) > 1 and len(names) == len(set(names)) == 3 + 60 * 25
    assert names[:4] == [
        "list_devices",
        "call_device_tool",
        "wait_for_event",
        "board_0000_thing_0_set",
    ]
    assert max(page_bytes(page) for page in pages) < 256 * 1024
    assert max(page_bytes(page) for page in pages) > PAGE_BYTES // 2  # pages are not tiny
    stack.close()


def test_a_listing_in_progress_survives_changes(tmp_path: Path) -> None:
    """Devices joining while a host pages through: no tool twice, none missing."""
    stack = Stack(make_config(tmp_path, tools_mode="per-device"))
    fleet(stack, 40)
    first, cursor = stack.frontend.tools()
    fleet(stack, 5, first=40)  # the fleet changes between pages
    rest = [t["name"] for page in every_page(stack, cursor) for t in page]
    names = [t["name"] for t in first] + rest
    assert len(names) == len(set(names)) == 3 + 40 * 25
    fresh = [t["name"] for page in every_page(stack) for t in page]
    assert len(fresh) == 3 + 45 * 25  # a new listing has the newcomers
    stack.close()


def test_a_stale_or_foreign_cursor_starts_again_cleanly(tmp_path: Path) -> None:
    """A cursor whose listing is gone, or one never given out, gets the first page."""
    stack = Stack(make_config(tmp_path, tools_mode="per-device"))
    fleet(stack, 40)
    _, stale = stack.frontend.tools()
    for n in range(40, 52):  # each join is a new listing: the old one falls out
        fleet(stack, 1, first=n)
        stack.frontend.tools()
    for cursor in (stale, "junk", "99999.1", "1.x"):
        tools, _ = stack.frontend.tools(cursor)
        assert [t["name"] for t in tools[:3]] == [
            "list_devices",
            "call_device_tool",
            "wait_for_event",
        ]
    stack.close()


def test_a_small_fleet_is_one_page(tmp_path: Path) -> None:
    """Below the bound there is no cursor at all."""
    stack = Stack(make_config(tmp_path))
    fleet(stack, 2, tools=3)
    tools, cursor = stack.frontend.tools()
    assert cursor is None and len(tools) == 3 + 6
    stack.close()


def test_listing_passes_make_no_sdk_models_and_share_the_catalogue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paging through 60 devices twice: one listing made, no SDK Tool model built per tool, and
    every device's copy of a tool points at the one schema of the catalogue they share."""
    built: list[str] = []
    make, construct = types.Tool.__init__, types.Tool.model_construct

    def counted_init(self: types.Tool, **data: Any) -> None:
        built.append("init")
        make(self, **data)

    def counted_construct(cls: type[types.Tool], *args: Any, **data: Any) -> types.Tool:
        built.append("construct")
        return construct(*args, **data)

    stack = Stack(make_config(tmp_path, tools_mode="per-device"))
    fleet(stack, 60)
    monkeypatch.setattr(types.Tool, "__init__", counted_init)
    monkeypatch.setattr(types.Tool, "model_construct", classmethod(counted_construct))
    first, second = every_page(stack), every_page(stack)
    assert first == second and len(first) > 1
    assert built == [] and stack.frontend.lister.listings_made == 1
    schemas = {id(t["inputSchema"]) for page in first for t in page[2:] if "_thing_" in t["name"]}
    assert len(schemas) == 25  # one per tool of the shared catalogue, not one per device
    types.Tool(name="probe", input_schema={"type": "object"})  # the counter itself counts
    assert built == ["init"]
    stack.close()


def test_a_called_tool_schema_is_found_without_listing(tmp_path: Path) -> None:
    """2026-era HTTP calls check Mcp-Param headers against the tool's schema: the SDK asks the
    server for it by name instead of paging through tools/list once per call."""
    stack = Stack(make_config(tmp_path, tools_mode="per-device"))
    fleet(stack, 2, tools=2)
    frontend = stack.frontend
    assert frontend.server.get_tool_input_schema == frontend.input_schema
    for _ in range(3):
        schema = frontend.input_schema("board_0000_thing_1_set")
        assert schema is not None and "level" in schema["properties"]
        assert frontend.input_schema("list_devices") == LIST_DEVICES.input_schema
        assert frontend.input_schema("nope") is None
    assert frontend.lister.listings_made == 1  # the current listing's groups, not one per call
    stack.close()

    grouped = Stack(make_config(tmp_path / "grouped", tools_mode="grouped"))
    fleet(grouped, 3, tools=1)
    schema = grouped.frontend.input_schema("thing_0_set")
    assert schema is not None and schema["required"][0] == "device"
    assert schema["properties"]["device"]["enum"] == [f"board_000{n}" for n in range(3)]
    listed, _ = grouped.frontend.tools()
    assert listed[3]["inputSchema"] == schema
    grouped.close()
