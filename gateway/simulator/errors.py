"""The simulator's exception tree.

::

    SimulatorError
    ├── HandshakeRefused   the gateway answered the upgrade with an HTTP status (401, 403…)
    └── HelloFailed        no acceptable server hello within 10 s
    ToolError              the firmware's (fw_envelope.ToolError): a tool failed; the device
                           answers with a JSON-RPC error carrying its message
    DeviceReboot           raised by a tool to make the device reboot before it replies

``DeviceReboot`` is a control signal, not a failure: like a power cut it passes through every
``except Exception``, the firmware's included, up to the simulated device, which drops its
connection without answering (what stock firmware does, docs/protocol.md §4).
"""

from __future__ import annotations

from device_fw.fw_envelope import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    TOOL_FAILED,
    ToolError,
)

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "METHOD_NOT_FOUND",
    "TOOL_FAILED",
    "DeviceReboot",
    "HandshakeRefused",
    "HelloFailed",
    "SimulatorError",
    "ToolError",
]


class SimulatorError(Exception):
    """Base class of every error the simulator raises on purpose."""


class HandshakeRefused(SimulatorError):
    """The gateway refused the WebSocket handshake; ``status`` is its HTTP status code."""

    def __init__(self, url: str, status: int) -> None:
        super().__init__(f"gateway at {url} refused the WebSocket handshake with HTTP {status}")
        self.url = url
        self.status = status


class HelloFailed(SimulatorError):
    """The server hello did not arrive in time, or the connection closed before it."""


class DeviceReboot(BaseException):
    """Raised by a tool handler: the device reboots at once and never sends the reply."""
