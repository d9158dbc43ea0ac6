"""Tests for gateway.host_side.device_listing: filters; pages stay small whatever the fleet."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.devices import known
from gateway.devices.registry import Device
from gateway.host_side.device_listing import DeviceQuery, list_devices
from tests.conftest import make_config
from tests.fakes import ScriptedSession, Stack, tool

LONG = "Does the thing. " * 40


@pytest.fixture
def stack(tmp_path: Path) -> Stack:
    stack = Stack(make_config(tmp_path))
    catalogue = tuple({**tool(f"self.t{i}"), "description": LONG} for i in range(25))
    for n in range(300):
        device_id = f"aa:{n:04x}"
        session = ScriptedSession()
        stack.registry.connect(device_id, session)
        stack.registry.set_catalogue(device_id, catalogue, {"name": "lamp" if n % 2 else "fan"})
        if n % 3 == 0:
            stack.registry.disconnect(device_id, session)
    return stack


def every_page(stack: Stack, cursor: str | None = None, **filters: str) -> list[dict[str, object]]:
    pages = []
    while True:
        page = list_devices(stack.registry.known, DeviceQuery({**filters, "cursor": cursor}))
        pages.append(page)
        cursor = page.get("next_cursor")
        if cursor is None:
            return pages


def test_every_device_once_in_pages_under_the_bound(stack: Stack) -> None:
    """300 devices with 25 long tools each come in several pages, each far under 1 MiB."""
    pages = every_page(stack)
    ids = [d["id"] for page in pages for d in page["devices"]]  # type: ignore[union-attr]
    assert len(pages) > 1 and len(ids) == len(set(ids)) == 300
    assert max(len(json.dumps(page)) for page in pages) < 256 * 1024
    stack.close()


def test_filters_by_name_board_and_state(stack: Stack) -> None:
    """Globs on the alias and board, and the online/offline state, narrow the list."""
    lamps = [d for p in every_page(stack, board="lamp*") for d in p["devices"]]  # type: ignore
    assert len(lamps) == 150 and {d["board"] for d in lamps} == {"lamp"}
    offline = [d for p in every_page(stack, state="offline") for d in p["devices"]]  # type: ignore
    assert len(offline) == 100 and not any(d["online"] for d in offline)
    named = list_devices(stack.registry.known, DeviceQuery({"name": "FAN_000*"}))["devices"]
    assert [d["device"] for d in named] == [f"fan_000{c}" for c in "02468ace"]
    assert list_devices(stack.registry.known, DeviceQuery({"state": "pending"})) == {"devices": []}
    stack.close()


def test_a_device_joining_between_pages_neither_repeats_nor_hides_others(stack: Stack) -> None:
    """The cursor is the last device shown: a newcomer earlier in the order shifts nothing."""
    first = list_devices(stack.registry.known, DeviceQuery({}))
    stack.registry.connect("00:00", ScriptedSession())  # sorts before everything shown
    rest = every_page(stack, cursor=first["next_cursor"])  # type: ignore[arg-type]
    ids = [d["id"] for d in first["devices"]] + [d["id"] for p in rest for d in p["devices"]]
    assert len(ids) == len(set(ids)) == 300
    stack.close()


class CountingQuery(DeviceQuery):
    """A query that counts the devices it is asked about: the work a page costs."""

    asked = 0

    def matches(self, device: Device) -> bool:
        CountingQuery.asked += 1
        return super().matches(device)


def ordered(monkeypatch: pytest.MonkeyPatch) -> list[Device]:
    """The devices whose place in the device order is worked out from now on (a sort of the
    fleet works out every device's)."""
    seen: list[Device] = []
    original = known._order_key

    def counted(device: Device) -> tuple[str, str]:
        seen.append(device)
        return original(device)

    monkeypatch.setattr(known, "_order_key", counted)
    return seen


def test_paging_through_the_fleet_looks_at_each_device_about_once(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each page starts where the last ended: the fleet is sorted once and each device looked
    at once (the device a page had no room for twice), not every device for every page."""
    CountingQuery.asked, cursor, pages = 0, None, 0
    placed = ordered(monkeypatch)
    while True:
        page = list_devices(stack.registry.known, CountingQuery({"cursor": cursor}))
        pages += 1
        if (cursor := page.get("next_cursor")) is None:
            break
    assert pages > 10
    assert CountingQuery.asked <= 300 + pages  # sorting again per page: about 300 x pages
    assert len(placed) <= 300 + 10 * pages  # one sort, then a bisect per page
    stack.close()


def test_a_join_is_put_in_its_place_without_sorting_the_fleet_again(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A newcomer, a rename and a forgotten device after the fleet was listed: each costs a
    search of the kept order (about log2 of 300 devices looked at), not a sort of the fleet."""
    list_devices(stack.registry.known, DeviceQuery({}))
    placed = ordered(monkeypatch)
    stack.registry.connect("bb:0001", ScriptedSession())
    stack.registry.set_catalogue("bb:0001", (tool("self.t"),), {"name": "kettle"})
    newcomer = stack.registry.get("bb:0001")
    assert newcomer is not None
    stack.registry.admin.rename(newcomer, "aardvark")
    stack.registry.admin.forget(newcomer)
    first = list_devices(stack.registry.known, DeviceQuery({}))["devices"][0]
    # five searches (the newcomer, its board name, the rename, forget, the page's start)
    assert len(placed) < 5 * 2 * 10 and first["device"] == "fan_0000"
    stack.close()


def test_the_order_follows_renames_arrivals_and_forgetting(stack: Stack) -> None:
    """The device order is kept between listings; each change that moves a device (a rename,
    a newcomer, its naming at its first listing) or removes one shows in the next listing."""

    def names() -> list[str]:
        return [str(d["device"]) for p in every_page(stack) for d in p["devices"]]  # type: ignore

    first = names()
    assert first == sorted(first)
    renamed = stack.registry.find(first[0])
    assert renamed is not None
    stack.registry.admin.rename(renamed, "zz_last")
    assert names()[-1] == "zz_last"
    stack.registry.admin.forget(stack.registry.find(first[1]))  # type: ignore[arg-type]
    assert first[1] not in names()
    stack.registry.connect("00:00", ScriptedSession())  # no board yet: named esp32_0000
    listed = names()
    assert listed[0] == "esp32_0000" and len(listed) == 300
    stack.registry.set_catalogue("00:00", (tool("self.t"),), {"name": "zebra"})
    listed = names()
    assert listed[-2:] == ["zebra_0000", "zz_last"] and "esp32_0000" not in listed
    assert listed == sorted(listed)
    stack.close()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"state": "asleep"}, "state must be one of"),
        ({"name": 5}, "name must be a string"),
        ({"cursor": "nope"}, "cursor is not one"),
    ],  # fmt: skip
)
def test_bad_queries_say_what_is_wrong(arguments: dict[str, object], message: str) -> None:
    """A malformed filter or cursor is a ValueError naming it."""
    with pytest.raises(ValueError, match=message):
        DeviceQuery(arguments)
