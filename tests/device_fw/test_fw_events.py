"""The firmware's event API (fw_events) and its alerts (fw_device), on CPython."""

from __future__ import annotations

from typing import Any

import pytest

from device_fw.fw_device import Device
from device_fw.fw_events import Events
from device_fw.fw_mcp import McpServer


def recorder() -> tuple[list[dict[str, Any]], Events]:
    sent: list[dict[str, Any]] = []
    return sent, Events(sent.append, clock=lambda: 0)


def test_a_reading_goes_when_it_moved_past_its_delta_and_a_dropped_one_goes_later() -> None:
    sent, events = recorder()
    events.tokens = 1.0  # one event left in the burst, the clock stopped
    assert events.reading("light", 500, delta=10)
    assert not events.reading("light", 505, delta=10)  # within the delta: nothing to say
    assert not events.reading("light", 600, delta=10)  # moved, but the rate drops it
    events.tokens = 1.0
    assert events.reading("light", 600, delta=10)  # still new to the gateway: it goes now
    assert [e["params"]["data"] for e in sent] == [{"value": 500}, {"value": 600}]
    assert events.dropped == 1


def test_a_threshold_is_crossed_once_each_way_with_its_hysteresis() -> None:
    sent, events = recorder()
    events.tokens = 100.0
    values = [39, 41, 42, 39.5, 38.9, 41]
    crossed = [events.threshold("heat", v, 40, hysteresis=1) for v in values]
    assert crossed == [False, True, False, False, True, True]
    said = [(e["params"]["level"], e["params"]["data"]["state"]) for e in sent]
    assert said == [("warning", "above"), ("info", "below"), ("warning", "above")]


def test_an_unknown_level_is_refused() -> None:
    _, events = recorder()
    with pytest.raises(ValueError, match="level must be one of"):
        events.emit("x", 1, level="loud")


def test_an_alert_with_all_three_strings_is_shown_and_any_other_is_not() -> None:
    """As stock firmware: status, message and emotion must all be strings."""
    device = Device(McpServer("t", "1"), link=None)  # type: ignore[arg-type]
    shown: list[tuple[str, str, str]] = []
    device.on_alert = lambda *alert: shown.append(alert)
    device.dispatch({"type": "alert", "status": "Notice", "message": "Hi", "emotion": "happy"})
    device.dispatch({"type": "alert", "status": "Notice", "message": "Hi"})
    device.dispatch({"type": "alert", "status": "Notice", "message": 3, "emotion": "happy"})
    assert shown == [("Notice", "Hi", "happy")]
