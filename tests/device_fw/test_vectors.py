"""The golden exchanges of tests/vectors/, replayed from the device side on both runtimes."""

from __future__ import annotations

import asyncio
import copy
import json
import sys
from typing import Any

import pytest

from tests.device_fw.conftest import (
    TESTS,
    VECTORS,
    passed_checks,
    run_on_micropython,
)

sys.path.append(str(TESTS))  # vector_replay imports the firmware by its board names
import vector_replay  # noqa: E402

import device_fw  # noqa: E402,F401  (puts the firmware's directory on sys.path)

DEVICE_VECTORS = vector_replay.device_vectors(str(VECTORS))


def test_device_side_vectors_are_found() -> None:
    """At least the four device-side vectors are there to replay."""
    assert len(DEVICE_VECTORS) >= 4


@pytest.mark.parametrize(("name", "vector"), DEVICE_VECTORS, ids=[n for n, _ in DEVICE_VECTORS])
def test_firmware_replays_vector_on_cpython(name: str, vector: dict[str, Any]) -> None:
    """The firmware (fw_device + fw_mcp) sends exactly the vector's device frames."""
    asyncio.run(vector_replay.replay(vector))


def test_a_doctored_vector_fails_the_replay() -> None:
    """The replay is not vacuous: a recorded error message changed by one word fails it."""
    vector = copy.deepcopy(dict(DEVICE_VECTORS)["error_without_code"])
    vector["exchange"][1]["message"]["payload"]["error"]["message"] = "Value exceeds maximum: 100"
    vector["exchange"][1]["message"]["session_id"] = "other"
    with pytest.raises(AssertionError, match="step 1"):
        asyncio.run(vector_replay.replay(vector))


def test_firmware_replays_every_vector_on_micropython() -> None:
    """The same replay on the real MicroPython unix port passes every device-side vector."""
    output = run_on_micropython("vector_replay.py", str(VECTORS))
    passed = passed_checks(output)
    assert passed == [name for name, _ in DEVICE_VECTORS], output


def test_vector_json_is_plain_json_micropython_can_read() -> None:
    """Every vector parses with the standard json module alone (no NaN, no comments)."""
    for path in VECTORS.glob("*.json"):
        json.loads(path.read_text(), parse_constant=lambda name: pytest.fail(name))
