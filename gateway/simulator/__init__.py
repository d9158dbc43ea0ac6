"""A device simulator: ESP32 boards that speak the xiaozhi protocol like stock firmware.

It lets a new user watch the whole path work with no hardware, and the end-to-end tests use it
as their device::

    async with SimulatedDevice("ws://127.0.0.1:8765/xiaozhi/v1/", token) as device:
        await device.wait_for_call("self.lamp.turn_on")

Layers, bottom up: ``cjson`` (the parser quirks stock firmware has), ``simtool`` (how a tool is
declared), ``mcp_server`` (the device's MCP server, no I/O), ``tools`` (the default board),
``device`` (the WebSocket client), ``fleet`` (many devices at once).
"""

from __future__ import annotations

from .device import SimulatedDevice, backoff_delay
from .errors import DeviceReboot, HandshakeRefused, HelloFailed, SimulatorError, ToolError
from .fleet import device_id_for, simulate
from .mcp_server import PAGE_LIMIT, DeviceMcpServer, Vision
from .simtool import Args, Prop, SimTool
from .tools import BoardState, default_tools

__all__ = [
    "PAGE_LIMIT",
    "Args",
    "BoardState",
    "DeviceMcpServer",
    "DeviceReboot",
    "HandshakeRefused",
    "HelloFailed",
    "Prop",
    "SimTool",
    "SimulatedDevice",
    "SimulatorError",
    "ToolError",
    "Vision",
    "backoff_delay",
    "default_tools",
    "device_id_for",
    "simulate",
]
