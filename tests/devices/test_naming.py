"""Tool naming: every name valid for Claude, unique, and the same after a restart."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.devices.naming import (
    META_TOOL_NAMES,
    NAME_PATTERN,
    MadeNames,
    NameAssignment,
    NameMap,
    PlainNames,
    ToolNames,
    clean_alias,
    derive_alias,
    tool_suffix,
)
from tests.counting import Calls

tool_names = st.text(min_size=1, max_size=150)
aliases = st.text(min_size=0, max_size=80)
device_ids = st.text(alphabet="0123456789abcdef:", min_size=1, max_size=20)


def test_design_example_name() -> None:
    """`kitchen` + `self.audio_speaker.set_volume` -> `kitchen_audio_speaker_set_volume`."""
    entry, is_new = NameMap().assign("aa:bb", "kitchen", "self.audio_speaker.set_volume")
    assert entry.name == "kitchen_audio_speaker_set_volume" and is_new


def test_derived_alias_uses_board_and_id_tail() -> None:
    """A device the config does not name is called after its board and its id's last bytes."""
    assert derive_alias("AA:BB:CC:DD:EE:FF", "bread-compact-wifi") == "bread-compact-wifi_eeff"
    assert derive_alias("x", None).startswith("esp32_")


def test_tool_suffix_drops_self_and_odd_characters() -> None:
    """Dots, spaces and non-ASCII become underscores; `self.` goes."""
    assert tool_suffix("self.lamp.turn on!") == "lamp_turn_on_"
    assert tool_suffix("self.").startswith("tool_")


def test_long_names_are_cut_with_a_hash() -> None:
    """A name over 64 characters is cut and ends in a short hash."""
    entry, _ = NameMap().assign("d", "a" * 40, "self." + "b" * 60)
    assert len(entry.name) == 64 and NAME_PATTERN.match(entry.name)


def test_meta_tool_names_are_never_given_to_device_tools() -> None:
    """A device tool that would be called list_devices gets another name."""
    entry, _ = NameMap().assign("d", "list", "self.devices")
    assert entry.name not in META_TOOL_NAMES


def test_renamed_device_gets_new_names() -> None:
    """Changing a device's alias renames its tools."""
    names = NameMap()
    first, _ = names.assign("d", "kitchen", "self.lamp.turn_on")
    second, is_new = names.assign("d", "hall", "self.lamp.turn_on")
    assert (first.name, second.name, is_new) == ("kitchen_lamp_turn_on", "hall_lamp_turn_on", True)
    assert names.lookup("kitchen_lamp_turn_on") is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(device_ids, aliases, tool_names), min_size=1, max_size=30))
def test_any_names_map_to_valid_unique_stable_mcp_names(
    entries: list[tuple[str, str, str]],
) -> None:
    """Any device tool names and aliases give valid, unique names that survive a restart."""
    names = NameMap()
    assigned: dict[tuple[str, str], tuple[str, str]] = {}
    for device_id, alias, tool in entries:
        if (device_id, tool) in assigned:
            continue  # one alias per device, as the registry guarantees
        entry, _ = names.assign(device_id, clean_alias(alias), tool)
        assigned[(device_id, tool)] = (entry.alias, entry.name)
        assert NAME_PATTERN.match(entry.name), entry.name
        assert entry.name not in META_TOOL_NAMES
    assert len({name for _, name in assigned.values()}) == len(assigned)
    restarted = NameMap(names.entries())
    for (device_id, tool), (alias, name) in reversed(list(assigned.items())):
        entry, is_new = restarted.assign(device_id, alias, tool)
        assert (entry.name, is_new) == (name, False)


@settings(max_examples=100, deadline=None)
@given(st.lists(tool_names, min_size=2, max_size=20, unique=True))
def test_collisions_resolve_the_same_way_whatever_the_order(tools: list[str]) -> None:
    """Two devices whose tools collide keep their names when they connect the other way round."""
    first = NameMap()
    for tool in tools:
        first.assign("dev-a", "same", tool)
    for tool in tools:
        first.assign("dev-b", "same", tool)
    restarted = NameMap(first.entries())
    for tool in reversed(tools):
        entry, is_new = restarted.assign("dev-b", "same", tool)
        assert not is_new
        assert first.lookup(entry.name) == ("dev-b", tool)


def shared(names: NameMap, device_id: str, alias: str, tools: ToolNames) -> dict[str, str]:
    """Assign ``tools`` on ``device_id`` and let it hold them through ``tools``, as the
    registry does; its names by tool."""
    found = {tool: names.assign(device_id, alias, tool)[0].name for tool in tools.names}
    names.share(device_id, tools)
    return found


def test_shared_names_collide_and_resolve_as_one_by_one_names() -> None:
    """Plain names held through a shared tool set still take their names first: a device whose
    alias and tool spell another's plain name gets a hashed one, and each name finds its pair."""
    names = NameMap()
    firmware = ToolNames(["self.b.c", "self.d"])
    first = shared(names, "dev-a", "a", firmware)
    second = shared(names, "dev-b", "a_b", ToolNames(["self.c"]))
    assert first == {"self.b.c": "a_b_c", "self.d": "a_d"}
    assert second["self.c"] != "a_b_c" and second["self.c"].startswith("a_b_c_")
    assert names.lookup("a_b_c") == ("dev-a", "self.b.c")
    assert names.lookup(second["self.c"]) == ("dev-b", "self.c")
    assert names.lookup("a_d") == ("dev-a", "self.d") and names.lookup("a_e") is None
    assert names.name_of("dev-a", "self.d") == "a_d" and names.name_of("dev-a", "self.e") is None
    restarted = NameMap(names.entries())
    assert shared(restarted, "dev-b", "a_b", ToolNames(["self.c"])) == second
    assert shared(restarted, "dev-a", "a", firmware) == first


def test_a_tool_no_longer_listed_keeps_its_name_and_a_rename_frees_them() -> None:
    """A firmware update that drops a tool leaves its name held (it comes back the same); a
    new alias gives every tool a new name and frees the old ones."""
    names = NameMap()
    shared(names, "d", "lamp", ToolNames(["self.on", "self.off"]))
    shared(names, "d", "lamp", ToolNames(["self.on"]))
    assert names.lookup("lamp_off") == ("d", "self.off")
    assert shared(names, "other", "lamp", ToolNames(["self.off"])) != {"self.off": "lamp_off"}
    assert shared(names, "d", "hall", ToolNames(["self.on", "self.off"])) == {
        "self.on": "hall_on", "self.off": "hall_off"}  # fmt: skip
    assert names.lookup("lamp_on") is None and names.lookup("lamp_off") is None
    names.forget("d")
    assert names.lookup("hall_on") is None and names.name_of("d", "self.on") is None


small_names = st.text(alphabet="ab_.", min_size=1, max_size=6)  # often collide, across "_" too


def spelled(made: MadeNames) -> list[NameAssignment]:
    """The assignments of what ``assign_all`` made, at once or one by one."""
    return made.entries() if isinstance(made, PlainNames) else made


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("pqr"), small_names,
                          st.lists(small_names, min_size=1, max_size=5)), max_size=8))  # fmt: skip
def test_a_whole_catalogue_at_once_is_named_as_one_by_one(
    joins: list[tuple[str, str, list[str]]],
) -> None:
    """``assign_all`` gives every pair the name ``assign`` then ``share`` would, reports the
    same names as new, and leaves the same names behind (for lookups and for a restart)."""
    one_by_one, at_once = NameMap(), NameMap()
    for device_id, alias, tools in joins:
        catalogue = ToolNames(tools)
        made = [e for t in catalogue.names for e, new in [one_by_one.assign(device_id, alias, t)]
                if new]  # fmt: skip
        one_by_one.share(device_id, catalogue)
        assert spelled(at_once.assign_all(device_id, alias, catalogue)) == made
    assert sorted(at_once.entries(), key=repr) == sorted(one_by_one.entries(), key=repr)
    for entry in one_by_one.entries():
        assert at_once.lookup(entry.name) == (entry.device_id, entry.tool)


def test_a_fleet_of_one_firmware_is_named_without_searching_a_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thousand devices of one firmware join: no name is searched for its holder and no
    name is held one by one, yet a plain name colliding across an underscore still is."""
    names = NameMap()
    searched = Calls(monkeypatch, names, "lookup")
    firmware = ToolNames([f"self.audio_speaker.tool_{i}" for i in range(25)])
    for n in range(1000):
        made = names.assign_all(f"dev-{n}", f"bread-compact-wifi_{n:04x}", firmware)
        assert isinstance(made, PlainNames) and len(made) == 25  # one object to persist
        assert made.rows()[0][3] == f"bread-compact-wifi_{n:04x}_audio_speaker_tool_0"
    assert searched.count == 0 and not names._special
    # "bread-compact-wifi_0001_audio" + "speaker.tool_0" spells a name device 1 holds.
    odd = spelled(names.assign_all("odd", "bread-compact-wifi_0001_audio",
                                   ToolNames(["speaker.tool_0"])))  # fmt: skip
    assert odd[0].name.startswith("bread-compact-wifi_0001_audio_speaker_tool_0_")
    assert names.lookup("bread-compact-wifi_0001_audio_speaker_tool_0") == (
        "dev-1", "self.audio_speaker.tool_0")  # fmt: skip
    assert names.lookup(odd[0].name) == ("odd", "speaker.tool_0")


def test_a_catalogue_at_once_yields_to_a_longer_alias_that_spells_its_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A device named ``lamp_audio`` holds ``lamp_audio_speaker_on``: a later ``lamp`` whose
    firmware has ``self.audio.speaker.on`` gets a hashed name for it, its other tools plain;
    once ``lamp_audio`` is gone, a ``lamp`` is named without searching a name."""
    names = NameMap()
    names.assign_all("early", "lamp_audio", ToolNames(["self.speaker.on"]))
    made = spelled(
        names.assign_all("late", "lamp", ToolNames(["self.audio.speaker.on", "self.off"]))
    )
    assert made[0].name.startswith("lamp_audio_speaker_on_") and made[1].name == "lamp_off"
    assert names.lookup("lamp_audio_speaker_on") == ("early", "self.speaker.on")
    assert names.lookup(made[0].name) == ("late", "self.audio.speaker.on")
    names.forget("early")
    searched = Calls(monkeypatch, names, "lookup")
    assert spelled(names.assign_all("later", "lamp", ToolNames(["self.x"])))[0].name == "lamp_x"
    assert searched.count == 0
