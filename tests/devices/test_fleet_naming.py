"""The fleet naming rule: replicas that know the same devices agree on every name, whatever
order the devices arrived in, with no history kept."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from gateway.config import DeviceOptions
from gateway.devices.fleet_naming import FleetNames
from gateway.devices.naming import NAME_PATTERN
from gateway.devices.registry import DeviceRegistry
from tests.conftest import make_config
from tests.fakes import ScriptedSession, Stack, tool

FLEET = [("aa:00", "kitchen", "self.lamp.on"), ("bb:00", "kitchen", "self.lamp.on"),
         ("cc:00", "hall", "self.lamp.on"), ("dd:00", "list", "devices")]  # fmt: skip


def names_after(order: tuple[tuple[str, str, str], ...]) -> dict[tuple[str, str], str]:
    names = FleetNames()
    for device_id, alias, tool_name in order:
        names.assign(device_id, alias, tool_name)
        for other in names.displaced():  # as the registry does: decide those again
            names.assign(other, *next((a, t) for d, a, t in FLEET if d == other))
    return {(e.device_id, e.tool): e.name for e in names.entries()}


def test_every_arrival_order_gives_the_same_names() -> None:
    """Two devices called kitchen both get hashed names; a unique one keeps its plain name."""
    results = {tuple(sorted(names_after(o).items())) for o in itertools.permutations(FLEET)}
    assert len(results) == 1
    names = dict(next(iter(results)))
    assert names[("cc:00", "self.lamp.on")] == "hall_lamp_on"
    kitchen = {names[("aa:00", "self.lamp.on")], names[("bb:00", "self.lamp.on")]}
    assert len(kitchen) == 2 and all(n.startswith("kitchen_lamp_on_") for n in kitchen)
    assert names[("dd:00", "devices")] != "list_devices"  # a meta-tool's name is never given
    assert all(NAME_PATTERN.fullmatch(n) for n in names.values())


def test_forgetting_a_claimant_gives_the_other_its_plain_name_back() -> None:
    """What a fresh replica would decide for the fleet as it now is: no history survives."""
    names = FleetNames()
    names.assign("aa:00", "kitchen", "self.lamp.on")
    names.assign("bb:00", "kitchen", "self.lamp.on")
    assert names.displaced() == {"aa:00"}  # its plain name must go: to decide again
    names.assign("aa:00", "kitchen", "self.lamp.on")
    names.forget("bb:00")
    assert names.displaced() == {"aa:00"}
    entry, new = names.assign("aa:00", "kitchen", "self.lamp.on")
    assert entry.name == "kitchen_lamp_on" and not new
    assert names.lookup("kitchen_lamp_on") == ("aa:00", "self.lamp.on")
    names.release("aa:00", keep=set())  # its catalogue no longer lists the tool
    assert names.lookup("kitchen_lamp_on") is None


@pytest.mark.anyio
async def test_a_cluster_registry_renames_the_first_device_when_a_second_takes_its_alias(
    tmp_path: Path,
) -> None:
    """In cluster mode the registry follows the rule: hosts see both devices under hashed names,
    and the first gets its plain names back when the second is forgotten."""
    kitchen = DeviceOptions(name="kitchen")
    config = make_config(
        tmp_path,
        cluster_broker=("mqtt://127.0.0.1:1",),
        devices={"aa:bb:cc:dd:ee:01": kitchen, "aa:bb:cc:dd:ee:02": kitchen},
    )
    stack = Stack(config)
    registry: DeviceRegistry = stack.registry
    for device_id in ("aa:bb:cc:dd:ee:01", "aa:bb:cc:dd:ee:02"):
        registry.connect(device_id, ScriptedSession())
        registry.set_catalogue(device_id, [tool("self.lamp.on")], {"name": "lamp"})
    second = registry.get("aa:bb:cc:dd:ee:02")
    assert second is not None
    names = sorted(t.name for t in registry.exposed_tools())
    assert len(names) == 2 and all(n.startswith("kitchen_lamp_on_") for n in names)
    registry.admin.forget(second)
    assert [t.name for t in registry.exposed_tools()] == ["kitchen_lamp_on"]
    stack.close()
