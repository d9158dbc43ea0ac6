"""The Messenger's refusals that the end-to-end tests do not reach (tests/e2e/test_notify_device.py
has the frames, the owner's limits and the audit)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.devices.messages import Messenger
from gateway.errors import CallRejected
from tests.conftest import make_config
from tests.fakes import ScriptedSession, Stack

pytestmark = pytest.mark.anyio


async def test_pending_rejected_and_unreachable_devices_and_a_strange_face_are_refused(
    tmp_path: Path,
) -> None:
    stack = Stack(make_config(tmp_path))
    registry = stack.registry
    messenger = Messenger(stack.config, stack.audit)
    registry.admin.admit(
        "aa:01", trusted=False, client_id="u1", transport="OTA"
    )  # waits for approval
    registry.admin.admit("aa:02", trusted=False, client_id="u2", transport="OTA")
    rejected = registry.get("aa:02")
    assert rejected is not None
    registry.admin.reject(rejected)
    # A board serving MCP: no alert frame, even over a session that could send one.
    session = ScriptedSession()
    session.send_frame = lambda text: pytest.fail("an alert went to an MCP board")  # type: ignore[attr-defined]
    registry.connect("aa:03", session, transport="mcp-http")
    said = {}
    for device_id, emotion in (("aa:01", None), ("aa:02", None), ("aa:03", None),
                               ("aa:03", "grumpy")):  # fmt: skip
        device = registry.get(device_id)
        assert device is not None
        with pytest.raises(CallRejected) as refused:
            await messenger.notify(device, "Hello", emotion, caller="test")
        said[device_id, emotion] = str(refused.value)
    stack.close()
    alias = registry.get("aa:01").alias  # type: ignore[union-attr]
    assert said["aa:01", None] == (
        f"device {alias} is waiting for approval (esp-mcp-gateway devices approve {alias})"
    )
    assert said["aa:02", None].endswith("was rejected")
    assert said["aa:03", None].endswith("cannot show messages over mcp-http")
    assert said["aa:03", "grumpy"].startswith("notify_device: `emotion` must be one of neutral,")
