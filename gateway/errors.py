"""The gateway's exception tree.

::

    GatewayError
    ├── ConfigError            a config file or environment value is wrong (names the key)
    ├── PortTaken              a listener's port is in use by another program
    ├── LocalProtocolError     we were about to send something the protocol forbids
    ├── InvalidState           an operation that the device session's state does not allow
    ├── CallRejected           the gateway refused to send a call (unknown tool, policy, arguments)
    ├── StorageUnavailable     the data dir cannot be written now (full, read-only): a request
    │                          that must be written first is refused (HTTP 503)
    └── DeviceError            a call to a device did not produce a result
        ├── DeviceUnavailable  the device is offline, unknown, or went away mid-call
        ├── DeviceBusy         the device has too many calls running and waiting: try later
        ├── DeviceTimeout      the device did not answer in time
        └── DeviceToolError    the device answered with a JSON-RPC error

Every ``DeviceError`` carries the ``device_id`` it concerns; ``DeviceToolError`` also carries the
device's JSON-RPC ``code`` when it sent one (stock firmware never does).
"""

from __future__ import annotations

__all__ = [
    "CallRejected",
    "ConfigError",
    "DeviceBusy",
    "DeviceError",
    "DeviceTimeout",
    "DeviceToolError",
    "DeviceUnavailable",
    "GatewayError",
    "InvalidState",
    "LocalProtocolError",
    "PortTaken",
    "StorageUnavailable",
]


class GatewayError(Exception):
    """Base class of every error the gateway raises on purpose."""


class ConfigError(GatewayError):
    """A configuration value is missing or wrong; the message names the key."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


class PortTaken(GatewayError):
    """A listener cannot bind: another program (often a gateway already running) holds the port."""

    def __init__(self, message: str, listener: str) -> None:
        super().__init__(message)
        self.listener = listener  # "device", "host" or "mqtt"


class LocalProtocolError(GatewayError):
    """The gateway tried to send something the device protocol forbids (e.g. an oversize frame)."""


class InvalidState(GatewayError):
    """An operation was attempted in a device-session state that does not allow it."""


class CallRejected(GatewayError):
    """The gateway refused a call before sending it: unknown tool, policy, or bad arguments."""


class StorageUnavailable(GatewayError):
    """The data dir cannot be written now; what needed the write was not done (try later)."""


class DeviceError(GatewayError):
    """A device call failed; ``device_id`` says which device."""

    def __init__(self, device_id: str, message: str) -> None:
        super().__init__(message)
        self.device_id = device_id


class DeviceUnavailable(DeviceError):
    """The device is offline or unknown, or it disconnected while a call was pending."""


class DeviceBusy(DeviceError):
    """The device has as many calls running and waiting as allowed; this one was not sent."""


class DeviceTimeout(DeviceError):
    """The device did not answer within the call's timeout."""


class DeviceToolError(DeviceError):
    """The device answered a request with a JSON-RPC error (``code`` is None when it sent none)."""

    def __init__(self, device_id: str, message: str, code: int | None = None) -> None:
        super().__init__(device_id, message)
        self.code = code
