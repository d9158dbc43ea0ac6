"""MQTT brokering: topic names, per-device credentials, and the embedded broker (our own)."""

from __future__ import annotations

from gateway.device_side.broker.credentials import DeviceCredentials
from gateway.device_side.broker.embedded import (
    GATEWAY_LOGIN,
    EmbeddedBroker,
    Presence,
    PresenceFeed,
)
from gateway.device_side.broker.topics import Topics, is_device_id

__all__ = [
    "GATEWAY_LOGIN",
    "DeviceCredentials",
    "EmbeddedBroker",
    "Presence",
    "PresenceFeed",
    "Topics",
    "is_device_id",
]
