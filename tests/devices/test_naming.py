"""Tool naming: every name valid for Claude, unique, and the same after a restart."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.devices.naming import (
    META_TOOL_NAMES,
    NAME_PATTERN,
    NameMap,
    clean_alias,
    derive_alias,
    tool_suffix,
)

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
