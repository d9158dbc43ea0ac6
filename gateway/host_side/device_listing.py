"""``list_devices`` and ``GET /api/devices``: devices filtered, described, and paged.

Every answer stays under ``PAGE_BYTES`` whatever the fleet, so neither a host nor the CLI ever
receives a reply an SDK client refuses (1 MiB). Pages follow the alias order, and a cursor is
the last device of a page: devices that join or leave meanwhile neither repeat nor push others
out of the listing.
"""

from __future__ import annotations

import fnmatch
import json
from typing import Any

from gateway.devices.calls import format_time
from gateway.devices.registry import PENDING, Device, DeviceView
from gateway.host_side.device_scope import DeviceScope

__all__ = ["STATES", "DeviceQuery", "describe_device", "list_devices"]

JsonObject = dict[str, Any]

PAGE_BYTES = 200_000
STATES = ("online", "offline", "pending")
_DEVICE_OVERHEAD = 400  # bytes of a device's entry beyond its tools
_TOOL_OVERHEAD = 120  # bytes of a tool's entry beyond its name, description and schema


class DeviceQuery:
    """Which devices to list: globs on the name (alias or id) and board, a state, a cursor;
    of the devices ``scope`` sees, when the caller is limited to some.

    Raises:
        ValueError: a filter or the cursor is malformed (the message says which).
    """

    def __init__(self, arguments: dict[str, object], scope: DeviceScope | None = None) -> None:
        self.scope = scope  # the caller's devices (device_scope.py); None: all
        self.name = _text(arguments, "name")
        self.board = _text(arguments, "board")
        self.state = _text(arguments, "state")
        if self.state is not None and self.state not in STATES:
            raise ValueError(f"state must be one of {', '.join(STATES)}")
        cursor = _text(arguments, "cursor")
        self.after: tuple[str, str] | None = None
        if cursor is not None:
            try:
                alias, device_id = json.loads(cursor)
                self.after = (str(alias), str(device_id))
            except (ValueError, TypeError):
                raise ValueError("cursor is not one this gateway gave out") from None

    def matches(self, device: Device) -> bool:
        """True when ``device`` passes every filter."""
        if self.scope is not None and not self.scope.sees(device):
            return False
        if self.state == PENDING:
            if device.record.state != PENDING:
                return False
        elif self.state is not None and device.online != (self.state == "online"):
            return False
        if self.name is not None and not (
            _glob(device.alias, self.name) or _glob(device.device_id, self.name)
        ):
            return False
        return self.board is None or _glob(device.record.board or "", self.board)


def list_devices(registry: DeviceView, query: DeviceQuery) -> JsonObject:
    """One page of the devices ``query`` selects, with ``next_cursor`` when more follow."""
    page: list[JsonObject] = []
    size = 0
    for device in registry.devices_after(query.after):  # a page's work, not the fleet's
        if not query.matches(device):
            continue
        weight = _weight(device)
        if page and size + weight > PAGE_BYTES:
            last = page[-1]
            return {"devices": page, "next_cursor": json.dumps([last["device"], last["id"]])}
        page.append(describe_device(device, schemas=weight <= PAGE_BYTES))
        size += weight
    return {"devices": page}


def describe_device(device: Device, *, schemas: bool = True) -> JsonObject:
    """One device as ``list_devices`` shows it: state, the model's tools, rejected tools.

    ``schemas`` False leaves out the tools' input schemas (a device whose schemas alone would
    not fit a page: ``call_device_tool`` still checks arguments against them).
    """
    described: JsonObject = {
        "device": device.alias,
        "id": device.device_id,
        "online": device.online,
        "state": device.record.state,  # approved, or pending / rejected: tools not served
        "last_seen": format_time(device.record.last_seen),
        "board": device.record.board,
        "firmware": device.firmware,
        "transport": device.record.transport,
        "tools": [
            {
                "tool": tool.spec.name,
                "mcp_name": tool.name,
                "description": tool.spec.description,
                **({"inputSchema": tool.spec.input_schema} if schemas else {}),
            }
            for tool in device.tools.values()
            if tool.refusal is None and device.approved
        ],
        "rejected": [{"tool": r.tool, "reason": r.reason} for r in device.rejected],
    }
    if not schemas:
        described["schemas_omitted"] = True
    if device.conflict is not None:
        described["conflict"] = device.conflict
    if device.upstream is not None:  # proxied: its voice server, and how that stands
        described["upstream"] = {"server": device.upstream.server, "state": device.upstream.state}
    return described


def _weight(device: Device) -> int:
    tools = sum(t.spec.size + _TOOL_OVERHEAD for t in device.tools.values())
    return _DEVICE_OVERHEAD + tools + sum(len(r.reason) + 60 for r in device.rejected)


def _glob(value: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(value.lower(), pattern.lower())


def _text(arguments: dict[str, object], key: str) -> str | None:
    value = arguments.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string")
    return value
