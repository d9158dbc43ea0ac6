"""A device simulator: ESP32 boards running the real firmware code (device_fw/) on CPython.

It lets a new user watch the whole path work with no hardware, and the end-to-end tests use it
as their device::

    async with SimulatedDevice("ws://127.0.0.1:8765/xiaozhi/v1/", token) as device:
        await device.wait_for_call("self.lamp.turn_on")

The firmware does the work: its WebSocket client, stock handshake and hello, serving loop with
reconnect backoff, and MCP server. This package gives it a typed face and a stock-like board.
Layers, bottom up: ``simtool`` (how a tool is declared), ``mcp_server`` (the firmware's MCP
server), ``tools`` (the default stock-like board), ``device`` (the firmware's device runtime),
``fleet`` (many devices at once, or the firmware's own simulated board).
"""

from __future__ import annotations

from .device import SimulatedDevice, backoff_delay
from .errors import DeviceReboot, HandshakeRefused, HelloFailed, SimulatorError, ToolError
from .fleet import device_id_for, firmware_device, simulate
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
    "firmware_device",
    "simulate",
]
