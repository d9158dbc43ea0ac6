"""The registry: what hosts see, when they are told, and what survives a restart."""

from __future__ import annotations

import asyncio
import gc
import sqlite3
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from gateway.config import Config, DeviceOptions
from gateway.devices import catalogue as catalogue_module
from gateway.devices.audit import Actor
from gateway.devices.catalogue import ToolSpec
from gateway.devices.decisions import ToolDecisions
from gateway.devices.device import Device, Verdict
from gateway.devices.exposure import Exposure
from gateway.devices.link import BOARD_TRANSPORT
from gateway.devices.naming import NameMap
from gateway.devices.store import DeviceRecord, Store
from tests.conftest import make_config
from tests.counting import Calls, SqlWrites
from tests.fakes import ScriptedSession, Stack, tool

pytestmark = pytest.mark.anyio


def pending(changes: object) -> bool:
    return changes.pending  # type: ignore[attr-defined]


async def test_new_catalogue_is_announced_once(tmp_path: Path) -> None:
    """A device's first catalogue is one change; connecting alone is none."""
    stack = Stack(make_config(tmp_path))
    async with stack.registry.changes() as changes:
        stack.registry.connect("aa:01", ScriptedSession())
        assert not pending(changes)
        stack.registry.set_catalogue("aa:01", (tool("self.a"),), None)
        assert pending(changes)
        await asyncio.wait_for(anext(changes), 1)
    stack.close()


async def test_reconnect_with_the_same_tools_is_not_a_change(tmp_path: Path) -> None:
    """A short drop with tools kept does not make hosts refetch (no flapping)."""
    stack = Stack(make_config(tmp_path))
    session = ScriptedSession()
    stack.registry.connect("aa:02", session)
    stack.registry.set_catalogue("aa:02", (tool("self.a"),), None)
    async with stack.registry.changes() as changes:
        stack.registry.disconnect("aa:02", session)
        again = ScriptedSession()
        stack.registry.connect("aa:02", again)
        stack.registry.set_catalogue("aa:02", (tool("self.a"),), None)
        assert not pending(changes)
    stack.close()


async def test_hide_mode_hides_offline_tools_after_the_grace(tmp_path: Path) -> None:
    """offline_tools = "hide" drops a device's tools once it stayed away past the grace."""
    now = [1000.0]
    stack = Stack(make_config(tmp_path, offline_tools="hide", offline_grace=0.05), lambda: now[0])
    session = ScriptedSession()
    stack.registry.connect("aa:03", session)
    stack.registry.set_catalogue("aa:03", (tool("self.a"),), None)
    async with stack.registry.changes() as changes:
        stack.registry.disconnect("aa:03", session)
        assert stack.registry.exposed_tools() and not pending(changes)
        now[0] += 1
        await asyncio.wait_for(anext(changes), 2)  # the grace timer re-checks
        assert not stack.registry.exposed_tools()
    stack.close()


async def test_a_newer_session_is_not_undone_by_the_old_one(tmp_path: Path) -> None:
    """The old link's late disconnect leaves a reconnected device online; the replacement is
    in the audit log."""
    stack = Stack(make_config(tmp_path))
    old, new = ScriptedSession(), ScriptedSession()
    stack.registry.connect("aa:04", old, transport="websocket")
    assert stack.registry.connect("aa:04", new, transport="websocket") is old
    stack.registry.disconnect("aa:04", old)
    device = stack.registry.find("aa:04")
    assert device is not None and device.online
    [replaced] = stack.audit.page(kind="login")["records"]
    assert (replaced["action"], replaced["caller"], replaced["outcome"]) == (
        "session replaced", "websocket", "ok")  # fmt: skip
    stack.close()


async def test_registry_survives_a_restart(tmp_path: Path) -> None:
    """Devices, catalogues, aliases and names come back from SQLite."""
    config = make_config(tmp_path, devices={"aa:05": DeviceOptions(name="Kitchen Lamp")})
    first = Stack(config)
    first.registry.connect("AA:05", ScriptedSession(), client_id="c1", transport="websocket")
    first.registry.set_catalogue("aa:05", (tool("self.light.on"),), {"name": "esp32-s3"})
    before = [t.name for t in first.registry.exposed_tools()]
    first.close()
    second = Stack(config)
    device = second.registry.find("Kitchen_Lamp")
    assert device is not None and not device.online
    assert device.record.board == "esp32-s3" and device.record.client_id == "c1"
    assert [t.name for t in second.registry.exposed_tools()] == before == ["Kitchen_Lamp_light_on"]
    second.close()


async def test_alias_is_fixed_when_the_device_is_first_seen(tmp_path: Path) -> None:
    """A stock device named at its OTA check-in keeps that name when initialize names a board."""
    stack = Stack(make_config(tmp_path))
    stack.registry.register("aa:bb:cc:dd:00:01", board="bread-compact-wifi", transport="mqtt")
    stack.registry.connect("aa:bb:cc:dd:00:01", ScriptedSession(), transport="mqtt")
    stack.registry.set_catalogue("aa:bb:cc:dd:00:01", (tool("self.a"),), {"name": "py-xiaozhi"})
    assert [t.name for t in stack.registry.exposed_tools()] == ["bread-compact-wifi_0001_a"]
    device = stack.registry.find("bread-compact-wifi_0001")
    assert device is not None and device.record.board == "bread-compact-wifi"
    stack.close()


async def test_device_first_seen_without_a_board_is_named_at_its_first_listing(
    tmp_path: Path,
) -> None:
    """A WebSocket handshake carries no board: the first listing names it, then it stays."""
    stack = Stack(make_config(tmp_path))
    stack.registry.connect("aa:bb:cc:dd:ee:ff", ScriptedSession())
    stack.registry.set_catalogue("aa:bb:cc:dd:ee:ff", (tool("self.a"),), {"name": "bread"})
    stack.registry.set_catalogue("aa:bb:cc:dd:ee:ff", (tool("self.a"),), {"name": "other"})
    assert [t.name for t in stack.registry.exposed_tools()] == ["bread_eeff_a"]
    stack.close()


def join(stack: Stack, n: int, tools: tuple[dict[str, object], ...]) -> None:
    device_id = f"02:00:00:00:{n >> 8:02x}:{n & 0xFF:02x}"
    stack.registry.connect(device_id, ScriptedSession(), transport="websocket")
    stack.registry.set_catalogue(device_id, tools, {"name": "bench-board", "version": "1"})


class Placings:
    """The devices put in or taken out of what hosts see (``Exposure.show`` and ``hide``), by
    id, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.ids: list[str] = []
        for name in ("show", "hide"):
            real = getattr(Exposure, name)

            def placed(exposure: Exposure, device: Device, real: Any = real) -> None:
                self.ids.append(device.device_id)
                real(exposure, device)

            monkeypatch.setattr(Exposure, name, placed)


def work(stack: Stack, placings: Placings, writes: SqlWrites) -> tuple[int, int, int]:
    """Devices placed, changes of what hosts see and rows written so far (every pending row
    written first)."""
    stack.store.flush()
    return len(placings.ids), stack.registry.version, writes.rows


async def test_a_join_costs_its_own_work_whatever_the_fleet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 3,001st device is the only one placed in what hosts see, one change of it, and
    writes as many rows as the 2nd."""
    placings, writes = Placings(monkeypatch), SqlWrites(monkeypatch)
    stack = Stack(make_config(tmp_path))
    tools = tuple(tool(f"self.tool_{i}", level={"type": "integer"}) for i in range(25))
    join(stack, 0, tools)
    before = work(stack, placings, writes)
    join(stack, 1, tools)
    small = tuple(b - a for a, b in zip(before, work(stack, placings, writes), strict=True))
    for n in range(2, 3000):
        join(stack, n, tools)
    before = work(stack, placings, writes)
    join(stack, 3000, tools)
    large = tuple(b - a for a, b in zip(before, work(stack, placings, writes), strict=True))
    # it alone placed, its tools shown in one change; its row and its plain names' row
    # written (not a row per name)
    assert small == large == (3, 1, 2)
    assert set(placings.ids[-3:]) == {"02:00:00:00:0b:b8"}
    assert len(stack.registry.exposed_tools()) == 3001 * 25
    stack.close()


def stored_rows(path: Path) -> dict[str, tuple[object, ...]]:
    """device_id -> (client_id, transport, last_seen), as the registry file has them."""
    with closing(sqlite3.connect(path)) as db:
        rows = db.execute("SELECT device_id, client_id, transport, last_seen FROM devices")
        return {row[0]: row[1:] for row in rows}


async def test_a_join_writes_its_device_row_once_after_its_approval(tmp_path: Path) -> None:
    """A new device approved by its token is written with its approval (Client-Id and
    transport too), then once more by its listing; its connect writes nothing of its own. A
    device coming back as it was writes only its listing's row; a new transport is written at
    once. What a connect leaves unwritten (its time) lands with the next write."""
    now = [1000.0]
    stack = Stack(make_config(tmp_path), lambda: now[0])
    registry, path = stack.registry, stack.config.data_dir / "registry.sqlite3"
    tools = (tool("self.a"),)
    assert (
        registry.admin.admit("aa:20", trusted=True, client_id="c1", transport="websocket") is None
    )
    await registry.admin.commit_decisions()  # what a login awaits before it is accepted
    assert stored_rows(path) == {"aa:20": ("c1", "websocket", 1000.0)}
    now[0] += 1
    session = ScriptedSession()
    registry.connect("aa:20", session, client_id="c1", transport="websocket")
    assert stack.store.flush() == 0
    registry.set_catalogue("aa:20", tools, None)
    assert stack.store.flush() == 3  # its row, its names' row and its (new) catalogue
    registry.disconnect("aa:20", session)
    assert stack.store.flush() == 1
    now[0] += 1
    registry.connect("aa:20", ScriptedSession(), client_id="c1", transport="websocket")
    assert stack.store.flush() == 0 and stored_rows(path)["aa:20"][2] == 1001.0
    registry.set_catalogue("aa:20", tools, None)
    assert stack.store.flush() == 1 and stored_rows(path)["aa:20"][2] == 1002.0
    registry.connect("aa:20", ScriptedSession(), transport="mqtt")  # MQTT: no Client-Id
    assert stack.store.flush() == 1 and stored_rows(path)["aa:20"][:2] == ("c1", "mqtt")
    stack.close()


async def test_whoever_watches_records_first_hears_of_a_new_device_as_it_is(
    tmp_path: Path,
) -> None:
    """A new device is announced (to the cluster, through the record watchers) with its state,
    Client-Id and transport already set: never as approved and unbound while it waits, which
    would let another replica bind it. An OTA check-in is no transport it connects over."""
    stack = Stack(make_config(tmp_path))
    registry = stack.registry
    first: dict[str, tuple[str, str | None, str | None]] = {}  # device id -> what was heard

    def watch(device_id: str, record: DeviceRecord | None) -> None:
        if record is not None:
            first.setdefault(device_id, (record.state, record.client_id, record.transport))

    registry.subscribe_records(watch)
    assert registry.admin.admit("aa:30", trusted=False, client_id="u1", transport="OTA") is None
    assert (
        registry.admin.admit("aa:31", trusted=True, client_id="c2", transport="websocket") is None
    )
    assert first == {"aa:30": ("pending", "u1", None), "aa:31": ("pending", "c2", "websocket")}
    device = registry.get("aa:31")  # then approved by its token, bound to its Client-Id
    assert device is not None and device.record.state == "approved"
    assert device.record.binding == "c2"
    stack.close()


async def test_devices_of_a_known_firmware_are_named_without_searching(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fleet of one firmware joins: no name is searched for its holder nor held one by one,
    and every name comes back the same after a restart."""
    stack = Stack(make_config(tmp_path))
    names = stack.registry.known._names
    assert isinstance(names, NameMap)
    searched = Calls(monkeypatch, names, "lookup")
    tools = tuple(tool(f"self.audio_speaker.tool_{i}") for i in range(25))
    for n in range(300):
        join(stack, n, tools)
    assert searched.count == 0 and not names._special
    before = [t.name for t in stack.registry.exposed_tools()]
    assert len(set(before)) == 300 * 25
    stack.close()
    again = Stack(make_config(tmp_path))
    assert [t.name for t in again.registry.exposed_tools()] == before
    for n in range(300):  # back after the restart: their names as they were, none new
        join(again, n, tools)
    assert again.store.flush() == 300  # the devices' rows; no name row
    assert [t.name for t in again.registry.exposed_tools()] == before
    again.close()


async def test_names_made_at_once_then_one_by_one_survive_a_restart(tmp_path: Path) -> None:
    """A device named at once that later lists a new tool and drops one, and a device whose
    plain name it would take, keep every name after a restart (the dropped tool's too)."""
    config = make_config(tmp_path, devices={"aa:07": DeviceOptions(name="lamp_aa06_b")})
    stack = Stack(config)
    stack.registry.connect("aa:06", ScriptedSession(), transport="websocket")
    stack.registry.set_catalogue("aa:06", (tool("self.a"), tool("self.b.c")), {"name": "lamp"})
    lamp = stack.registry.get("aa:06")
    assert lamp is not None
    stack.registry.set_catalogue("aa:06", (tool("self.b.c"), tool("self.d")), None)
    stack.registry.connect("aa:07", ScriptedSession(), transport="websocket")
    stack.registry.set_catalogue("aa:07", (tool("self.c"),), None)  # spells lamp's b.c
    names = stack.registry.known._names
    before = {(e.device_id, e.tool): e.name for e in names.entries()}
    assert lamp.alias == "lamp_aa06" and before[("aa:06", "self.a")] == "lamp_aa06_a"
    assert before[("aa:06", "self.b.c")] == "lamp_aa06_b_c" and len(before) == 4
    assert before[("aa:07", "self.c")].startswith("lamp_aa06_b_c_")  # hashed: taken
    stack.close()
    again = Stack(config)
    assert {(e.device_id, e.tool): e.name for e in again.registry.known._names.entries()} == before
    again.close()


def held_per_device(stack: Stack, tools: tuple[dict[str, object], ...], first: int) -> float:
    """Objects the collector tracks, per device, that 200 more devices of ``tools`` add."""
    gc.collect()
    before = len(gc.get_objects())
    for n in range(first, first + 200):
        join(stack, n, tools)
    stack.store.flush()  # the names' rows written, not pending
    gc.collect()
    return (len(gc.get_objects()) - before) / 200


async def test_an_idle_device_of_a_shared_firmware_holds_no_object_per_tool(
    tmp_path: Path,
) -> None:
    """Its tools are decided once per firmware and named through the firmware's shared names:
    one more device of a 25-tool firmware adds as many objects as one of a 1-tool firmware,
    and every tool still has its own name, found again by lookup."""
    stack = Stack(make_config(tmp_path))
    many = tuple(tool(f"self.audio_speaker.tool_{i}", level={"type": "integer"}) for i in range(25))
    one = (tool("self.lamp.turn_on"),)
    held_per_device(stack, many, 0)  # warm: the firmwares judged, the dicts grown
    held_per_device(stack, one, 1000)
    with_many = held_per_device(stack, many, 2000)
    with_one = held_per_device(stack, one, 3000)
    assert with_many == pytest.approx(with_one, abs=0.5)  # before: 52 objects more a device
    devices = [d for d in stack.registry.devices() if len(d.tools) == 25]
    assert len({id(d.decisions) for d in devices}) == 1 and len(devices) == 400
    assert len(stack.registry.known._names._special) == 0  # no name held one by one
    exposed = stack.registry.exposed_tools()
    assert len(exposed) == 400 * 25 + 400 and len({t.name for t in exposed}) == len(exposed)
    for listed in exposed[::97]:
        found = stack.registry.lookup(listed.name)
        assert found == listed and found is not None and found.name == listed.name
    stack.close()


async def test_same_firmware_is_judged_once_and_shared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thousand devices with one catalogue share one judged Catalogue object."""
    judged = Calls(monkeypatch, catalogue_module, "judge")
    stack = Stack(make_config(tmp_path))
    tools = tuple(tool(f"self.tool_{i}") for i in range(5))
    for n in range(1000):
        join(stack, n, tools)
    catalogues = {id(d.catalogue) for d in stack.registry.devices()}
    assert len(catalogues) == 1 and judged.count == 1
    stack.close()


class SpyDecisions(ToolDecisions):
    """The policy's verdicts, counting the tools it was asked about."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.asked = 0

    def verdicts(self, specs: Sequence[ToolSpec], options: DeviceOptions) -> list[Verdict]:
        self.asked += len(specs)
        return super().verdicts(specs, options)


async def test_the_policy_is_asked_once_per_shared_catalogue(tmp_path: Path) -> None:
    """A fleet of one firmware: the policy judges its tools once for every device the config
    says nothing of, and apart for a device it configures (whose verdicts differ)."""
    lamp = "02:00:00:00:00:05"
    config = make_config(tmp_path, devices={lamp: DeviceOptions(deny=("self.tool_1",))})
    policy = SpyDecisions(config)
    stack = Stack(config, decisions=policy)
    tools = tuple(tool(f"self.tool_{i}") for i in range(5))
    for n in range(100):
        join(stack, n, tools)
    assert policy.asked == 5 + 5  # the fleet's, and the configured device's
    refused = {t.spec.name for t in stack.registry.get(lamp).tools.values() if t.refusal}
    others = [t for d in stack.registry.devices() if d.device_id != lamp for t in d.tools.values()]
    assert refused == {"self.tool_1"} and not any(t.refusal for t in others)
    stack.close()


async def test_leaving_and_coming_back_costs_nothing_in_keep_mode(tmp_path: Path) -> None:
    """A drop and a reconnect with the same tools change nothing hosts see and announce
    nothing."""
    stack = Stack(make_config(tmp_path))
    tools = (tool("self.a"), tool("self.b"))
    for n in range(100):
        join(stack, n, tools)
    device = stack.registry.find("02:00:00:00:00:07")
    assert device is not None and device.session is not None
    version = stack.registry.version
    async with stack.registry.changes() as changes:
        stack.registry.disconnect(device.device_id, device.session)
        join(stack, 7, tools)
        assert not pending(changes)
    assert stack.registry.version == version
    stack.close()


async def test_one_bad_tool_leaves_the_rest_of_its_device_served(tmp_path: Path) -> None:
    """A rejected tool is absent from the list, shown with its reason; the rest is served."""
    stack = Stack(make_config(tmp_path))
    bad = {"name": "self.bad", "inputSchema": {"type": "object", "properties": "nope"}}
    stack.registry.connect("aa:09", ScriptedSession())
    stack.registry.set_catalogue("aa:09", (tool("self.good"), bad), None)
    assert [t.spec.name for t in stack.registry.exposed_tools()] == ["self.good"]
    device = stack.registry.find("aa:09")
    assert device is not None and [r.tool for r in device.rejected] == ["self.bad"]
    stack.close()


async def test_forget_frees_the_device_and_its_names(tmp_path: Path) -> None:
    """A forgotten device is gone from the list, the lookups and the store; its names free."""
    stack = Stack(make_config(tmp_path, devices={"aa:01": DeviceOptions(name="lamp"),
                                                 "aa:02": DeviceOptions(name="lamp")}))  # fmt: skip
    registry = stack.registry
    registry.connect("aa:01", ScriptedSession())
    registry.set_catalogue("aa:01", (tool("self.on"),), None)
    device = registry.find("aa:01")
    assert device is not None
    async with registry.changes() as changes:
        registry.admin.forget(device)
        assert pending(changes)
    assert registry.find("aa:01") is None and registry.find("lamp") is None
    assert not registry.exposed_tools() and registry.online_count == 0
    registry.connect("aa:02", ScriptedSession())
    registry.set_catalogue("aa:02", (tool("self.on"),), None)
    assert [t.name for t in registry.exposed_tools()] == ["lamp_on"]  # the name was freed
    stack.close()
    again = Stack(make_config(tmp_path))
    assert again.registry.find("aa:01") is None and again.registry.find("aa:02") is not None
    again.close()


async def test_a_device_without_a_token_waits_for_approval(tmp_path: Path) -> None:
    """No token: pending, tools hidden and refused; approval shows them and binds its Client-Id."""
    stack = Stack(make_config(tmp_path))
    registry = stack.registry
    assert registry.admin.admit("aa:10", trusted=False, client_id="uuid-1", transport="OTA") is None
    registry.connect("aa:10", ScriptedSession())
    registry.set_catalogue("aa:10", (tool("self.a"),), None)
    device = registry.get("aa:10")
    assert device is not None and device.record.state == "pending"
    assert not registry.exposed_tools()
    assert "waiting for approval" in (device.tools["self.a"].refused(user=True) or "")
    registry.admin.approve(device)
    assert [t.spec.name for t in registry.exposed_tools()] == ["self.a"]
    assert device.record.binding == "uuid-1"
    refusal = registry.admin.admit("aa:10", trusted=True, client_id="uuid-2", transport="websocket")
    assert refusal is not None and "bound" in refusal and device.conflict
    assert registry.admin.admit("aa:10", trusted=False, client_id="uuid-1", transport="OTA") is None
    stack.close()


async def test_tokens_pairing_and_auto_adoption_approve_new_devices(tmp_path: Path) -> None:
    """A device token, an open pairing window or adoption = auto let a new device in at once."""
    now = [1000.0]
    stack = Stack(make_config(tmp_path), lambda: now[0])
    registry = stack.registry
    registry.admin.admit("aa:01", trusted=True, client_id=None, transport="mqtt")
    registry.admin.pair(60)
    registry.admin.admit("aa:02", trusted=False, client_id="u2", transport="OTA")
    now[0] += 61
    registry.admin.admit("aa:03", trusted=False, client_id="u3", transport="OTA")
    states = {d.device_id: d.record.state for d in registry.devices()}
    assert states == {"aa:01": "approved", "aa:02": "approved", "aa:03": "pending"}
    stack.close()
    auto = Stack(make_config(tmp_path / "auto", adoption="auto"))
    auto.registry.admin.admit("aa:04", trusted=False, client_id="u4", transport="OTA")
    assert auto.registry.get("aa:04").record.state == "approved"  # type: ignore[union-attr]
    auto.close()


async def test_rejected_device_is_refused_and_its_state_survives_a_restart(tmp_path: Path) -> None:
    """A rejected device is refused even with a token, also after a restart."""
    stack = Stack(make_config(tmp_path))
    stack.registry.admin.admit("aa:20", trusted=False, client_id="u", transport="OTA")
    stack.registry.admin.reject(stack.registry.get("aa:20"))  # type: ignore[arg-type]
    stack.close()
    again = Stack(make_config(tmp_path))
    refusal = again.registry.admin.admit(
        "aa:20", trusted=True, client_id="u", transport="websocket"
    )
    assert refusal == "device aa:20 was rejected"
    again.close()


async def test_pending_devices_are_capped_and_expire(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Past max_pending a new stock device is refused (logged once, counted, audited); a
    pending device unseen for pending_expiry makes room; a token or pairing still gets in."""
    now = [1000.0]
    stack = Stack(make_config(tmp_path, max_pending=3, pending_expiry=3600), lambda: now[0])
    registry = stack.registry
    for n in range(3):
        assert (
            registry.admin.admit(f"aa:{n:02x}", trusted=False, client_id="u", transport="OTA")
            is None
        )
    for n in range(3, 50):
        refusal = registry.admin.admit(f"aa:{n:02x}", trusted=False, client_id="u", transport="OTA",
                                       peer="10.0.0.9")  # fmt: skip
        assert refusal == "3 devices wait for approval already"
    assert len(registry.devices()) == 3 and registry.admin.pending_refused == 47
    assert caplog.text.count("devices wait for approval already ([devices] max_pending)") == 1
    assert registry.admin.admit("bb:01", trusted=True, client_id=None, transport="mqtt") is None
    now[0] += 1800
    registry.register("aa:00", board="b")  # seen again: stays
    now[0] += 1801
    assert registry.admin.admit("aa:40", trusted=False, client_id="u", transport="OTA") is None
    assert sorted(registry.waiting) == ["aa:00", "aa:40"]
    assert registry.get("aa:01") is None and registry.get("bb:01") is not None
    [refused] = stack.audit.page(kind="login")["records"]
    assert (refused["from"], refused["outcome"]) == ("10.0.0.9", "refused")
    stack.close()


async def test_discovered_boards_never_take_a_stock_devices_place(tmp_path: Path) -> None:
    """Boards found over mDNS wait apart from stock devices: with every stock place taken a
    board still waits, and 51 waiting boards leave the one stock place free, after a restart
    too; approved or forgotten, a board waits no more."""
    stack = Stack(make_config(tmp_path, max_pending=1))
    registry = stack.registry
    for n in range(50):
        assert registry.admin.admit(f"mcp-{n:012x}", trusted=False, client_id=f"board:u{n}",
                                    transport=BOARD_TRANSPORT) is None  # fmt: skip
    assert registry.admin.admit("aa:00", trusted=False, client_id="u", transport="OTA") is None
    assert registry.admin.admit("aa:01", trusted=False, client_id="u", transport="OTA") == (
        "1 devices wait for approval already"
    )
    assert registry.admin.admit("mcp-0000000000ff", trusted=False, client_id="board:v",
                                transport=BOARD_TRANSPORT) is None  # fmt: skip
    assert list(registry.waiting) == ["aa:00"] and len(registry.waiting_boards) == 51
    stack.close()
    again = Stack(make_config(tmp_path, max_pending=1))
    registry = again.registry
    assert list(registry.waiting) == ["aa:00"] and len(registry.waiting_boards) == 51
    registry.admin.approve(registry.get("mcp-000000000000"))  # type: ignore[arg-type]
    registry.admin.forget(registry.get("mcp-000000000001"))  # type: ignore[arg-type]
    assert len(registry.waiting_boards) == 49 and list(registry.waiting) == ["aa:00"]
    again.close()


async def test_settle_commits_and_audits_a_users_change(tmp_path: Path) -> None:
    """What the user did is on disk and in the audit log when ``settle`` returns."""
    stack = Stack(make_config(tmp_path))
    registry = stack.registry
    registry.admin.admit("aa:30", trusted=False, client_id="u", transport="OTA")
    registry.admin.approve(registry.get("aa:30"))  # type: ignore[arg-type]
    await registry.admin.settle("approve", registry.get("aa:30"), Actor("cli", "127.0.0.1"))
    again = Store(tmp_path / "registry.sqlite3")
    [saved] = again.load().devices
    assert (saved.state, saved.binding) == ("approved", "u")
    again.close()
    [entry] = stack.audit.page(kind="admin")["records"]
    assert (entry["action"], entry["caller"], entry["device_id"]) == ("approve", "cli", "aa:30")
    stack.close()


async def test_an_approved_device_without_a_binding_is_bound_at_its_first_login(
    tmp_path: Path,
) -> None:
    """Enrolled (named before it came) or known to an older version: the first login binds."""
    stack = Stack(make_config(tmp_path))
    registry = stack.registry
    registry.admin.adopt("aa:50", "Desk")
    assert (
        registry.admin.admit("aa:50", trusted=True, client_id="uuid-1", transport="websocket")
        is None
    )
    assert registry.get("aa:50").record.binding == "uuid-1"  # type: ignore[union-attr]
    refusal = registry.admin.admit("aa:50", trusted=True, client_id="uuid-2", transport="websocket",
                                   peer="10.0.0.66")  # fmt: skip
    assert refusal == "device aa:50 is bound to another identity"
    [conflict] = stack.audit.page(kind="login")["records"]
    assert (conflict["action"], conflict["from"]) == ("login conflict", "10.0.0.66")
    stack.close()


async def test_logins_wait_until_their_decisions_are_on_disk_and_share_a_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fifty devices let in by their token at once: one transaction writes all fifty bindings
    before any login is accepted; a login that decided nothing writes nothing."""
    writes = SqlWrites(monkeypatch)
    stack = Stack(make_config(tmp_path))
    registry = stack.registry
    for n in range(50):
        registry.admin.admit(f"aa:{n:02x}", trusted=True, client_id=f"u{n}", transport="websocket")
    before = writes.transactions
    await asyncio.gather(*(registry.admin.commit_decisions() for _ in range(50)))
    assert writes.transactions == before + 1
    saved = Store(tmp_path / "registry.sqlite3")
    assert sorted(r.binding or "" for r in saved.load().devices) == sorted(
        f"u{n}" for n in range(50)
    )
    saved.close()
    await registry.admin.commit_decisions()
    assert writes.transactions == before + 1
    stack.close()


async def test_logins_arriving_during_a_commit_share_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group commit: twenty logins decided while one commit runs wait for it, then share
    a single second transaction, and all twenty are on disk when they are let in."""
    writes = SqlWrites(monkeypatch)
    stack = Stack(make_config(tmp_path))
    registry = stack.registry
    before = writes.transactions
    registry.admin.admit("bb:00", trusted=True, client_id="u", transport="websocket")
    first = asyncio.create_task(registry.admin.commit_decisions())
    await asyncio.sleep(0)  # one turn of the loop: its commit has taken the batch
    for n in range(1, 21):
        registry.admin.admit(f"bb:{n:02x}", trusted=True, client_id=f"u{n}", transport="websocket")
    await asyncio.gather(first, *(registry.admin.commit_decisions() for _ in range(20)))
    assert writes.transactions == before + 2
    saved = Store(tmp_path / "registry.sqlite3")
    assert len(saved.load().devices) == 21
    saved.close()
    stack.close()


async def test_a_client_id_that_spells_a_token_binding_is_refused(tmp_path: Path) -> None:
    """A device bound to its token over MQTT is not taken over by a check-in or a WebSocket
    that presents the binding itself as its Client-Id (it would get that binding's OTA
    credential, and with it the MQTT login, without ever knowing the token)."""
    from gateway.devices.tokens import token_binding

    stack = Stack(make_config(tmp_path))
    registry = stack.registry
    bound = token_binding("a-board-token")
    assert registry.admin.admit("aa:60", trusted=True, client_id=bound, transport="mqtt") is None
    for transport in ("OTA", "websocket"):
        refusal = registry.admin.admit("aa:60", trusted=False, client_id=bound, transport=transport)
        assert refusal is not None and "Client-Id" in refusal
    refusal = registry.admin.admit("aa:61", trusted=False, client_id=bound, transport="OTA")
    assert refusal is not None and registry.get("aa:61") is None
    stack.close()


async def test_a_pending_device_is_not_swapped_for_another_client_id_before_approval(
    tmp_path: Path,
) -> None:
    """Someone who checks in with a pending device's id but another Client-Id just before the
    user approves (or while a pairing window is open) is refused as a conflict: the approval
    binds the device the user saw, not the last check-in."""
    stack = Stack(make_config(tmp_path))
    registry = stack.registry
    assert (
        registry.admin.admit("aa:70", trusted=False, client_id="uuid-real", transport="OTA") is None
    )
    registry.register("aa:70", client_id="uuid-real")
    refusal = registry.admin.admit("aa:70", trusted=False, client_id="uuid-evil", transport="OTA",
                                   peer="10.0.0.66")  # fmt: skip
    assert refusal == "device aa:70 is bound to another identity"
    device = registry.get("aa:70")
    assert device is not None and device.conflict
    registry.admin.pair(60)
    assert registry.admin.admit("aa:70", trusted=False, client_id="uuid-evil", transport="OTA")
    assert device.record.state == "pending"
    assert (
        registry.admin.admit("aa:70", trusted=False, client_id="uuid-real", transport="OTA") is None
    )
    assert (device.record.state, device.record.binding) == ("approved", "uuid-real")
    stack.close()


async def test_a_device_approved_before_bindings_is_not_bound_to_an_impostor(
    tmp_path: Path,
) -> None:
    """Known to a version before bindings (approved, bound to nothing): a check-in with another
    Client-Id than the one it was last seen with is refused, and one without a token never binds
    a device whose Client-Id is unknown; its own Client-Id or its token still bind it."""
    stack = Stack(make_config(tmp_path))
    registry = stack.registry
    registry.register("aa:80", client_id="uuid-real")  # as an older version left it
    registry.register("aa:81")  # our firmware: it only ever logged in with its token
    refusal = registry.admin.admit("aa:80", trusted=False, client_id="uuid-evil", transport="OTA")
    assert refusal == "device aa:80 is bound to another identity"
    assert registry.admin.admit("aa:81", trusted=False, client_id="uuid-evil", transport="OTA")
    assert registry.get("aa:81").record.binding is None  # type: ignore[union-attr]
    assert (
        registry.admin.admit("aa:80", trusted=False, client_id="uuid-real", transport="OTA") is None
    )
    assert (
        registry.admin.admit("aa:81", trusted=True, client_id="token:ab", transport="mqtt") is None
    )
    bindings = {d.device_id: d.record.binding for d in registry.devices()}
    assert bindings == {"aa:80": "uuid-real", "aa:81": "token:ab"}
    stack.close()


async def test_the_shared_token_does_not_approve_a_waiting_stock_device_for_someone_else(
    tmp_path: Path,
) -> None:
    """The shared token is on every board running our firmware: a login with it and a stock
    device's id does not approve that waiting device for itself (another Client-Id, or MQTT's
    token identity); with the device's own Client-Id (py-xiaozhi given the token) it does."""
    stack = Stack(make_config(tmp_path))
    registry = stack.registry
    assert (
        registry.admin.admit("aa:90", trusted=False, client_id="uuid-real", transport="OTA") is None
    )
    registry.register("aa:90", client_id="uuid-real")
    for transport, presented in (("websocket", "uuid-evil"), ("mqtt", "token:ab")):
        refusal = registry.admin.admit(
            "aa:90", trusted=True, client_id=presented, transport=transport
        )
        assert refusal == "device aa:90 is bound to another identity"
    device = registry.get("aa:90")
    assert device is not None and device.record.state == "pending"
    assert (
        registry.admin.admit("aa:90", trusted=True, client_id="uuid-real", transport="websocket")
        is None
    )
    assert (device.record.state, device.record.binding) == ("approved", "uuid-real")
    stack.close()


def test_a_fleet_record_brings_the_devices_firmware_version(tmp_path: Path) -> None:
    """cluster: a device another replica saw (no catalogue here yet, e.g. pending) shows its
    firmware version here too; a later record without one keeps it."""
    stack = Stack(make_config(tmp_path))
    info = {"name": "bread", "version": "1.9.2"}
    seen = DeviceRecord(device_id="aa:07", alias="desk", first_seen=1.0, last_seen=1.0,
                        state="pending", server_info=info)  # fmt: skip
    assert stack.registry.admin.learn(seen).firmware == "1.9.2"
    renamed = DeviceRecord(device_id="aa:07", alias="den", first_seen=2.0, last_seen=2.0,
                           state="pending")  # fmt: skip
    assert stack.registry.admin.learn(renamed).firmware == "1.9.2"
    stack.close()
