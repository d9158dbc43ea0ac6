"""The meta-tool ``notify_device``: a message on a device's screen (``gateway.devices.messages``).

Beside ``list_devices`` and ``call_device_tool``, always listed; every refusal is an ``isError``
result that says why (docs/messages.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mcp.types as types

from gateway.devices.messages import DEFAULT_EMOTION, EMOTIONS, MAX_MESSAGE, TOOL, Messenger
from gateway.devices.registry import Device
from gateway.errors import CallRejected, DeviceError
from gateway.host_side.call_results import text_content
from gateway.host_side.callers import Caller

__all__ = ["NOTIFY_DEVICE", "notify_device"]

# The device a reference names for the caller, or why there is none (mcp_server's _device_for).
FindDevice = Callable[..., Device | str]

NOTIFY_DEVICE = types.Tool(
    name=TOOL,
    title="Show a message on a device",
    description="Put a short message in front of the people near a device: it shows on the "
    "device's screen with a sound (stock xiaozhi firmware's alert). `device` is the device "
    "name (or id) as list_devices shows it. The owner may limit how often, turn messages off, "
    "or set quiet hours; a device on WebSocket takes messages only while it is connected.",
    input_schema={
        "type": "object",
        "properties": {
            "device": {"type": "string", "description": "device name or id"},
            "message": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_MESSAGE,
                "description": "plain text, no control characters",
            },
            "emotion": {
                "type": "string",
                "enum": list(EMOTIONS),
                "description": f"the face shown with it (default {DEFAULT_EMOTION})",
            },
        },
        "required": ["device", "message"],
        "additionalProperties": False,
    },
    annotations=types.ToolAnnotations(
        read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=True
    ),
)


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[text_content(text)], is_error=True)


async def notify_device(
    messenger: Messenger, find: FindDevice, caller: Caller, arguments: dict[str, Any]
) -> types.CallToolResult:
    """Answer one ``notify_device`` call by ``caller``; ``find`` gives the device a reference
    names for it, or why there is none (one outside its scope is unknown to it)."""
    if caller.refusal is not None:
        return _error(caller.refusal)
    device_ref = arguments.get("device")
    if not isinstance(device_ref, str):
        return _error(f"{TOOL} needs a string `device`: which device to show the message on")
    device = find(device_ref, arguments=arguments)
    if isinstance(device, str):
        return _error(device)
    try:
        done = await messenger.notify(device, arguments.get("message"), arguments.get("emotion"),
                                      caller=caller.name, origin=caller.origin)  # fmt: skip
    except (CallRejected, DeviceError) as exc:
        return _error(str(exc))
    return types.CallToolResult(content=[text_content(done)])
