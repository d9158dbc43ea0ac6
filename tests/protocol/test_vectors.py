"""Replay the golden exchanges of tests/vectors/ through DeviceProtocol, playing the device."""

from __future__ import annotations

import dataclasses
import json
from collections import deque
from pathlib import Path
from typing import Any

import pytest

from gateway.protocol import DeviceProtocol, Event, State

VECTORS = Path(__file__).parent.parent / "vectors"
GATEWAY_VECTORS = sorted(
    path for path in VECTORS.glob("*.json") if "gateway" in json.loads(path.read_text())["sides"]
)


def _event_as_json(event: Event) -> dict[str, Any]:
    fields = json.loads(json.dumps(dataclasses.asdict(event), default=list))  # Entries: a list
    return {"event": type(event).__name__, **fields}


def _matches(expected: dict[str, Any], actual: dict[str, Any]) -> bool:
    return all(key in actual and actual[key] == value for key, value in expected.items())


def _replay(vector: dict[str, Any]) -> list[Event]:
    now = [0.0]  # the time moves only when the I/O layer's timer would fire (below)
    protocol = DeviceProtocol(
        "vector-device",
        session_id=vector["session_id"],
        clock=lambda: now[0],
        **vector.get("gateway", {}),
    )
    produced: deque[str] = deque()
    events: list[Event] = []
    for index, step in enumerate(vector["exchange"]):
        if step["from"] == "device":
            assert not produced, f"step {index}: unexpected gateway frame {produced[0]}"
            protocol.receive_text(step.get("text") or json.dumps(step["message"]))
        elif step.get("trigger") == "call":
            params = step["message"]["payload"]["params"]
            protocol.call_tool(params["name"], params["arguments"])
        produced.extend(protocol.data_to_send())
        if not produced and protocol.state is State.READY and protocol.timer is not None:
            now[0] = protocol.timer  # a change held back by relist_interval: its timer fires
            protocol.handle_timer()
            produced.extend(protocol.data_to_send())
        events.extend(protocol.events_received())
        if step["from"] == "gateway":
            assert produced, f"step {index}: the gateway sent nothing"
            assert json.loads(produced.popleft()) == step["message"], f"step {index}"
    assert not produced, f"unexpected gateway frames at the end: {list(produced)}"
    return events


def test_vectors_directory_holds_gateway_vectors() -> None:
    """The vectors directory is found and most vectors apply to the gateway."""
    assert len(GATEWAY_VECTORS) >= 5


@pytest.mark.parametrize("path", GATEWAY_VECTORS, ids=lambda path: path.stem)
def test_gateway_replays_vector(path: Path) -> None:
    """The gateway sends exactly the vector's gateway frames and emits its events."""
    vector = json.loads(path.read_text())
    events = [_event_as_json(event) for event in _replay(vector)]
    expected = vector.get("gateway_events")
    if expected is not None:
        assert len(events) == len(expected), events
        for want, got in zip(expected, events, strict=True):
            assert _matches(want, got), (want, got)


@pytest.mark.parametrize("path", sorted(VECTORS.glob("*.json")), ids=lambda path: path.stem)
def test_vector_is_well_formed(path: Path) -> None:
    """Every vector follows the format of tests/vectors/README.md."""
    vector = json.loads(path.read_text())
    assert isinstance(vector["description"], str)
    assert set(vector["sides"]) <= {"gateway", "device"}
    assert vector["sides"]
    for step in vector["exchange"]:
        assert step["from"] in {"device", "gateway"}
        assert ("message" in step) != ("text" in step)
        assert step.get("trigger", "connect") in {"connect", "call", "tools_changed"}
