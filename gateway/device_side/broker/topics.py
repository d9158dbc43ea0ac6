"""MQTT topic names of the device contract, shared by the transport, the broker and OTA.

Per device (docs/mqtt.md): ``<prefix>/<device-id>/up`` (the device publishes, QoS 0),
``<prefix>/<device-id>/down`` (the gateway publishes) and ``<prefix>/<device-id>/status``
(retained ``online``/``offline``, our firmware's presence and last will). The device id is the
lower-case MAC ``aa:bb:cc:dd:ee:ff``, the same id stock firmware sends everywhere else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["KINDS", "Topics", "is_device_id"]

# Lower case only: the id is part of topics and the broker's ACL, where case matters. No "/",
# "+", "#" (topic syntax) and no "@" (the gateway's own broker login starts with it).
_DEVICE_ID = re.compile(r"[0-9a-z][0-9a-z:._-]{0,63}")

KINDS = ("up", "down", "status")


def is_device_id(text: object) -> bool:
    """True if ``text`` can name a device in MQTT topics (e.g. ``aa:bb:cc:dd:ee:ff``)."""
    return isinstance(text, str) and _DEVICE_ID.fullmatch(text) is not None


@dataclass(frozen=True, slots=True)
class Topics:
    """The topic names under one prefix."""

    prefix: str = "xiaozhi"

    def up(self, device_id: str) -> str:
        """Where ``device_id`` publishes (its OTA ``publish_topic``)."""
        return f"{self.prefix}/{device_id}/up"

    def down(self, device_id: str) -> str:
        """Where the gateway publishes to ``device_id``."""
        return f"{self.prefix}/{device_id}/down"

    def every(self, kind: str) -> str:
        """The filter that matches topic ``kind`` of every device."""
        return f"{self.prefix}/+/{kind}"

    def parse(self, topic: str) -> tuple[str, str] | None:
        """Split a device topic into ``(device_id, kind)``; None if it is not one."""
        head = self.prefix + "/"
        if not topic.startswith(head):
            return None
        device_id, sep, kind = topic[len(head) :].partition("/")
        if not sep or kind not in KINDS or not is_device_id(device_id):
            return None
        return device_id, kind
