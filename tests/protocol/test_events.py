"""Tests for gateway.protocol.events: the event types DeviceProtocol emits."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.protocol.events import (
    CallFailed,
    CallSucceeded,
    DeviceGoodbye,
    HelloReceived,
    MessageDropped,
    ToolsListed,
)

EVENTS = [
    HelloReceived({"type": "hello"}),
    ToolsListed(()),
    CallSucceeded(1, {}),
    CallFailed(1, "boom"),
    DeviceGoodbye(),
    MessageDropped("why"),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda event: type(event).__name__)
def test_events_are_frozen_and_slotted(event: object) -> None:
    """Events cannot be changed and carry no __dict__."""
    assert not hasattr(event, "__dict__")
    for field in dataclasses.fields(event):  # type: ignore[arg-type]
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(event, field.name, None)


def test_event_defaults() -> None:
    """Optional fields default to a complete listing, no code and an empty detail."""
    assert ToolsListed(()) == ToolsListed((), None, True)
    assert CallFailed(1, "x").code is None
    assert MessageDropped("x").detail == {}
    assert MessageDropped("x").detail is not MessageDropped("y").detail
