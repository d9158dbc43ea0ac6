"""What hosts are told about a tool: the user's config, else the device, else a guess."""

from __future__ import annotations

from gateway.config import DeviceOptions
from gateway.devices.policy import Hints, tool_hints


def test_config_globs_win_over_the_device_s_own_hints() -> None:
    """A device calling its relay read-only is overruled by the owner's `destructive` glob."""
    options = DeviceOptions(read_only=("self.sensor.*",), destructive=("relay.*",))
    assert tool_hints("self.relay.set", options, read_only=True) == Hints(False, True)
    assert tool_hints("self.sensor.read", options, destructive=True) == Hints(True, False)


def test_the_device_s_hints_beat_the_name_guess_with_mcp_defaults_for_the_rest() -> None:
    """readOnlyHint alone implies not destructive; destructiveHint alone means not read-only."""
    options = DeviceOptions()
    assert tool_hints("self.get_status", options, destructive=True) == Hints(False, True)
    assert tool_hints("self.lamp.blink", options, read_only=True) == Hints(True, False)
    assert tool_hints("self.lamp.blink", options, read_only=False) == Hints(False, True)


def test_without_hints_the_name_decides() -> None:
    """get_* reads, reboot destroys, anything else is neither."""
    options = DeviceOptions()
    assert tool_hints("self.get_device_status", options) == Hints(True, False)
    assert tool_hints("self.reboot", options) == Hints(False, True)
    assert tool_hints("self.lamp.turn_on", options) == Hints(False, False)
