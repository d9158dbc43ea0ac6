"""Tests for gateway.host_side.tool_listing: pages under the size bound; cursors survive changes;
a change costs the devices it concerns, not the fleet."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import mcp.types as types
import pytest

from gateway.config import DeviceOptions
from gateway.devices.name_rules import META_TOOL_NAMES
from gateway.devices.registry import Device, DeviceTool
from gateway.host_side import tool_listing
from gateway.host_side.device_scope import DeviceScope, scope_of
from gateway.host_side.mcp_server import LIST_DEVICES
from gateway.host_side.tool_listing import PAGE_BYTES, ToolLister
from tests.conftest import make_config
from tests.fakes import ScriptedSession, Stack, tool

JsonObject = dict[str, Any]

TEXT = "Sets the thing. " * 30  # stock descriptions run long

META = len(META_TOOL_NAMES)  # the meta-tools page one of every listing starts with


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


def every_page(
    stack: Stack, cursor: str | None = None, scope: DeviceScope | None = None
) -> list[list[JsonObject]]:
    pages = []
    while True:
        tools, cursor = stack.frontend.tools(cursor, scope)
        pages.append(tools)
        if cursor is None:
            return pages


def test_sixty_devices_come_in_pages_under_the_bound(tmp_path: Path) -> None:
    """1,500 device tools: every one listed once, in order, every page far under 1 MiB."""
    stack = Stack(make_config(tmp_path, tools_mode="per-device"))
    fleet(stack, 60)
    pages = every_page(stack)
    names = [t["name"] for page in pages for t in page]
    assert len(pages) > 1 and len(names) == len(set(names)) == META + 60 * 25
    meta = ["list_devices", "call_device_tool", "wait_for_event", "notify_device"]
    assert names[:5] == [*meta, "board_0000_thing_0_set"]
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
    assert len(names) == len(set(names)) == META + 40 * 25
    fresh = [t["name"] for page in every_page(stack) for t in page]
    assert len(fresh) == META + 45 * 25  # a new listing has the newcomers
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
        names = [t["name"] for t in tools[:4]]
        assert names == ["list_devices", "call_device_tool", "wait_for_event", "notify_device"]
    stack.close()


def test_a_small_fleet_is_one_page(tmp_path: Path) -> None:
    """Below the bound there is no cursor at all."""
    stack = Stack(make_config(tmp_path))
    fleet(stack, 2, tools=3)
    tools, cursor = stack.frontend.tools()
    assert cursor is None and len(tools) == META + 6
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
    assert built == []
    schemas = {
        id(t["inputSchema"]) for page in first for t in page[META:] if "_thing_" in t["name"]
    }
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

    stack.close()

    grouped = Stack(make_config(tmp_path / "grouped", tools_mode="grouped"))
    fleet(grouped, 3, tools=1)
    schema = grouped.frontend.input_schema("thing_0_set")
    assert schema is not None and schema["required"][0] == "device"
    assert schema["properties"]["device"]["enum"] == [f"board_000{n}" for n in range(3)]
    listed, _ = grouped.frontend.tools()
    assert listed[META]["inputSchema"] == schema
    grouped.close()


def test_a_scoped_caller_pages_through_its_devices_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scope of 16 devices of 60 (aliases end in the ids' hex): its pages hold their tools
    only, each once; paging again asks the scope about no device again, and a join asks it
    about the newcomer alone (a change costs the change for a limited caller too)."""
    stack = Stack(make_config(tmp_path, tools_mode="per-device"))
    fleet(stack, 60)
    scope = scope_of(["board_000*"])
    asked: list[str] = []
    sees = DeviceScope.sees
    monkeypatch.setattr(
        DeviceScope,
        "sees",
        lambda self, device: asked.append(device.device_id) or sees(self, device),
    )
    for _ in range(3):
        names = [t["name"] for page in every_page(stack, scope=scope) for t in page]
        assert len(names) == len(set(names)) == META + 16 * 25
        assert all(n.startswith("board_000") for n in names[META:])
    assert sorted(asked) == [f"aa:{n:04x}" for n in range(60)]
    fleet(stack, 1, first=60)
    every_page(stack, scope=scope)
    assert asked[60:] == ["aa:003c"]
    stack.close()


def test_a_grouped_tool_names_only_the_scoped_callers_devices(tmp_path: Path) -> None:
    """In grouped mode a group shared by three devices lists, to a caller limited to one, that
    one alone in its `device` enum; a group none of its devices has is not listed."""
    stack = Stack(make_config(tmp_path, tools_mode="grouped"))
    fleet(stack, 3, tools=2)
    (tools,) = every_page(stack, scope=scope_of(["board_0001"]))
    groups = tools[META:]
    assert [g["inputSchema"]["properties"]["device"]["enum"] for g in groups] == [
        ["board_0001"],
        ["board_0001"],
    ]
    assert every_page(stack, scope=scope_of(["nothing*"])) == [every_page(stack)[0][:META]]
    stack.close()


# --- a change costs the change -------------------------------------------------------------


def looked_at(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The devices the lister looks at from now on (each call of ``listed_tools``)."""
    seen: list[str] = []
    original = tool_listing.listed_tools

    def counted(device: Device, cutoff: float) -> tuple[DeviceTool, ...]:
        seen.append(device.device_id)
        return original(device, cutoff)

    monkeypatch.setattr(tool_listing, "listed_tools", counted)
    return seen


def listed(lister: ToolLister) -> list[JsonObject]:
    """Every tool of the lister's current listing, page by page, in wire form."""
    tools, _, cursor = lister.page(None)
    while cursor is not None:
        more, _, cursor = lister.page(cursor)
        tools += more
    return tools


def as_fresh(stack: Stack) -> bool:
    """True when the kept listing is what a lister made afresh from the fleet would list."""
    return listed(stack.frontend.lister) == listed(ToolLister(stack.config, stack.registry.known))


@pytest.mark.parametrize("mode", ["per-device", "grouped", "auto"])
@pytest.mark.parametrize("size", [10, 400])
def test_a_join_looks_at_the_newcomer_only_whatever_the_fleet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, size: int
) -> None:
    """The first tools/list after a device joins looks at that device, in a fleet of 10 as of
    400, and lists what a listing made from the whole fleet would."""
    stack = Stack(make_config(tmp_path, tools_mode=mode))
    fleet(stack, size, tools=5)
    seen = looked_at(monkeypatch)
    every_page(stack)
    assert len(seen) == size  # the first listing reads the fleet once
    seen.clear()
    fleet(stack, 1, tools=5, first=size)
    pages = every_page(stack)
    assert seen == [f"aa:{size:04x}"]
    assert sum(len(page) for page in pages) == META + (5 if stack.frontend.lister.current().mode
                                                    == "grouped" else 5 * (size + 1))  # fmt: skip
    assert as_fresh(stack)
    stack.close()


def test_leaving_renaming_and_forgetting_look_at_that_device_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Offline tools are kept (listed still), a rename moves the device, a forgotten one
    leaves: each looks at one device, and the listing stays what a fresh one would be."""
    stack = Stack(make_config(tmp_path, tools_mode="per-device"))
    fleet(stack, 60, tools=3)
    session = ScriptedSession()
    stack.registry.connect("aa:0007", session)
    every_page(stack)
    seen = looked_at(monkeypatch)
    device = stack.registry.get("aa:0007")
    assert device is not None
    stack.registry.disconnect("aa:0007", session)
    names = [t["name"] for page in every_page(stack) for t in page]
    assert seen == ["aa:0007"] and "board_0007_thing_0_set" in names  # offline, kept
    seen.clear()
    stack.registry.admin.rename(device, "zz_kitchen")
    tools = [t["name"] for page in every_page(stack) for t in page]
    assert seen == ["aa:0007"] and tools[-3:] == [f"zz_kitchen_thing_{i}_set" for i in range(3)]
    assert as_fresh(stack)
    seen.clear()
    stack.registry.admin.forget(device)
    tools = [t["name"] for page in every_page(stack) for t in page]
    assert seen == ["aa:0007"] and len(tools) == META + 59 * 3 and as_fresh(stack)
    stack.close()


class LateClock:
    """The lister's clock (``time``), run forward by the test."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def time(self) -> float:
        return time.time() + self.ahead

    def monotonic(self) -> float:
        return time.monotonic() + self.ahead


def test_a_device_gone_past_the_offline_age_leaves_when_its_time_comes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """offline_age: the listing leaves a device out once it has been gone that long, and
    looks at that device alone to do so (no pass over the fleet)."""
    stack = Stack(make_config(tmp_path, tools_mode="per-device", tools_offline_age=60))
    fleet(stack, 50, tools=2)
    clock = LateClock()
    monkeypatch.setattr(tool_listing, "time", clock)
    session = ScriptedSession()
    stack.registry.connect("aa:0003", session)
    stack.registry.disconnect("aa:0003", session)
    every_page(stack)
    seen = looked_at(monkeypatch)
    clock.ahead = 30
    assert len(listed(stack.frontend.lister)) == 50 * 2 and seen == []  # not yet
    clock.ahead = 61
    tools = listed(stack.frontend.lister)
    assert seen == ["aa:0003"] and len(tools) == 49 * 2
    assert "board_0003_thing_0_set" not in [t["name"] for t in tools]
    stack.close()


def test_a_second_device_of_a_name_looks_at_the_two_it_renames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cluster naming: a second device called kitchen changes the first one's names too; the
    change looks at those two, not at the rest of the fleet."""
    kitchen = DeviceOptions(name="kitchen")
    config = make_config(tmp_path, tools_mode="per-device", cluster_broker=("mqtt://127.0.0.1:1",),
                         devices={"bb:01": kitchen, "bb:02": kitchen})  # fmt: skip
    stack = Stack(config)
    fleet(stack, 100, tools=2)
    stack.registry.connect("bb:01", ScriptedSession())
    stack.registry.set_catalogue("bb:01", [tool("self.lamp.on")], {"name": "lamp"})
    assert "kitchen_lamp_on" in [t["name"] for page in every_page(stack) for t in page]
    seen = looked_at(monkeypatch)
    stack.registry.connect("bb:02", ScriptedSession())
    stack.registry.set_catalogue("bb:02", [tool("self.lamp.on")], {"name": "lamp"})
    names = [t["name"] for page in every_page(stack) for t in page]
    assert sorted(set(seen)) == ["bb:01", "bb:02"]
    kitchens = [n for n in names if n.startswith("kitchen_")]
    assert len(kitchens) == 2 and "kitchen_lamp_on" not in kitchens and as_fresh(stack)
    stack.close()


def test_groups_follow_schemas_members_and_first_appearance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Grouped: a second schema of a tool renames the group it shares a name with, a device
    earlier in the order moves a group up, the last member leaving drops it: each a change of
    one device, each listing what a fresh one would."""
    stack = Stack(make_config(tmp_path, tools_mode="grouped"))
    fleet(stack, 30, tools=2, first=10)
    every_page(stack)
    seen = looked_at(monkeypatch)
    stack.registry.connect("aa:0001", ScriptedSession())
    stack.registry.set_catalogue("aa:0001", [tool("self.thing_0.set", volume={"type": "integer"}),
                                             tool("self.first")], {"name": "board"})  # fmt: skip
    tools = listed(stack.frontend.lister)
    names = [t["name"] for t in tools]
    assert seen == ["aa:0001"] and len(names) == 4 and as_fresh(stack)
    assert names[1] == "first" and names[0].startswith("thing_0_set_")  # board_0001 is first
    seen.clear()
    forgotten = stack.registry.get("aa:0001")
    assert forgotten is not None
    stack.registry.admin.forget(forgotten)
    assert [t["name"] for t in listed(stack.frontend.lister)] == ["thing_0_set", "thing_1_set"]
    assert seen == ["aa:0001"] and as_fresh(stack)
    stack.close()


def test_a_grouped_listing_in_progress_survives_its_groups_emptying(tmp_path: Path) -> None:
    """A host pages through groups while the only device offering them is forgotten: the rest
    of that listing is empty, never an error, and a new listing has none of them."""
    stack = Stack(make_config(tmp_path, tools_mode="grouped"))
    fleet(stack, 1, tools=400)
    first, cursor = stack.frontend.tools()
    assert cursor is not None and len(first) < META + 400
    device = stack.registry.get("aa:0000")
    assert device is not None
    stack.registry.admin.forget(device)
    another, _ = stack.frontend.tools()  # another host lists: the groups empty
    rest = [t["name"] for page in every_page(stack, cursor) for t in page]
    assert rest == [] and len(another) == META
    stack.close()


def test_crossing_the_budget_regroups_without_reading_the_fleet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """auto: the join that takes the fleet past `[tools] budget` turns the listing grouped, and
    the one that brings it back turns it per-device, each looking at that one device."""
    stack = Stack(make_config(tmp_path, tools_budget=12))
    fleet(stack, 2, tools=5)
    assert stack.frontend.lister.current().mode == "per-device"
    seen = looked_at(monkeypatch)
    fleet(stack, 1, tools=5, first=2)
    assert stack.frontend.lister.current().mode == "grouped" and seen == ["aa:0002"]
    assert as_fresh(stack)  # (a fresh lister reads the fleet)
    seen.clear()
    third = stack.registry.get("aa:0002")
    assert third is not None
    stack.registry.admin.forget(third)
    assert stack.frontend.lister.current().mode == "per-device" and seen == ["aa:0002"]
    assert as_fresh(stack)
    stack.close()


@pytest.mark.anyio
async def test_hidden_offline_devices_leave_and_come_back_one_look_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """offline_tools = "hide": a device that leaves (no grace) goes out of the listing, and
    comes back when it reconnects with its catalogue, each time looking at it alone."""
    config = make_config(tmp_path, tools_mode="grouped", offline_tools="hide", offline_grace=0.0)
    stack = Stack(config)
    fleet(stack, 30, tools=2)
    stack.registry.connect("bb:01", session := ScriptedSession())
    stack.registry.set_catalogue("bb:01", [tool("self.kettle.boil")], {"name": "kettle"})
    assert "kettle_boil" in [t["name"] for t in listed(stack.frontend.lister)]
    seen = looked_at(monkeypatch)
    stack.registry.disconnect("bb:01", session)
    assert "kettle_boil" not in [t["name"] for t in listed(stack.frontend.lister)]
    assert seen == ["bb:01"] and as_fresh(stack)
    seen.clear()
    stack.registry.connect("bb:01", ScriptedSession())
    assert "kettle_boil" in [t["name"] for t in listed(stack.frontend.lister)]
    assert seen == ["bb:01"] and as_fresh(stack)
    stack.close()
