"""The simulator's exception tree.

::

    SimulatorError
    ├── HandshakeRefused   the gateway answered the upgrade with an HTTP status (401, 403…)
    ├── HelloFailed        no acceptable server hello within 10 s, or one that would crash a device
    └── ToolError          a tool handler failed; becomes a JSON-RPC error with its message
    DeviceReboot           raised by a tool to make the device reboot before it replies

``DeviceReboot`` is a control signal, not a failure, so it derives from ``Exception`` directly and
``DeviceMcpServer`` lets it through to the device, which drops its connection.
"""

from __future__ import annotations

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

# JSON-RPC error codes, sent only by a server with ``error_codes=True`` (our firmware's behaviour;
# stock firmware sends none, xiaozhi-protocol.md §4 "Errors").
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
TOOL_FAILED = -32000


class SimulatorError(Exception):
    """Base class of every error the simulator raises on purpose."""


class HandshakeRefused(SimulatorError):
    """The gateway refused the WebSocket handshake; ``status`` is its HTTP status code."""

    def __init__(self, url: str, status: int) -> None:
        super().__init__(f"gateway at {url} refused the WebSocket handshake with HTTP {status}")
        self.url = url
        self.status = status


class HelloFailed(SimulatorError):
    """The server hello did not arrive in time, or was one a stock device cannot accept."""


class ToolError(SimulatorError):
    """A tool failed; the device answers with a JSON-RPC error carrying ``message``.

    ``code`` is used only by a server with ``error_codes=True`` (stock firmware sends no code).
    """

    def __init__(self, message: str, code: int = TOOL_FAILED) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class DeviceReboot(Exception):
    """Raised by a tool handler: the device reboots at once and never sends the reply."""
