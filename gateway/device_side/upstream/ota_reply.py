"""The OTA reply a proxied device gets: its voice server's, with the connection parts rewritten.

``activation`` (code, challenge), ``firmware``, ``server_time`` and any key the gateway does not
know pass through unchanged, so first-time activation and firmware upgrades work as without the
gateway. ``websocket`` keeps the upstream's keys (``version`` above all: the device frames its
audio by it) but names the gateway's URL and the device's gateway credential. ``mqtt`` is
rewritten by the MQTT half of the proxy (``MqttUpstreams``) when the gateway has a broker;
without one it is left out, and the device, which prefers MQTT only when the section is there,
talks WebSocket through the gateway. Nothing here has side effects: the caller keeps the
upstream's settings once the whole reply passed its checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.device_side.upstream.settings import (
    UpstreamSettingsError,
    UpstreamWebSocket,
    parse_upstream_websocket,
)

__all__ = ["MqttUpstreams", "ProxiedReply", "proxied_reply"]

JsonObject = dict[str, Any]
_CONNECTIONS = ("websocket", "mqtt")


class MqttUpstreams(Protocol):
    """The MQTT half of the proxy, as the OTA endpoint sees it."""

    def device_section(self, theirs: Mapping[str, Any], own: Mapping[str, Any]) -> JsonObject:
        """The ``mqtt`` section the device gets, from the upstream's and the gateway's own.

        Raises:
            UpstreamSettingsError: the gateway cannot log in where the upstream says.
        """
        ...

    def keep(self, device_id: str, theirs: Mapping[str, Any] | None) -> None:
        """Keep (None: forget) the upstream's ``mqtt`` section for the gateway's MQTT client."""
        ...


@dataclass(frozen=True, slots=True)
class ProxiedReply:
    """What the device gets, and what the gateway keeps for its side."""

    reply: JsonObject
    websocket: UpstreamWebSocket | None
    """The upstream's WebSocket, when the device is told to use the gateway's."""
    mqtt: Mapping[str, Any] | None
    """The upstream's ``mqtt`` section, when the device is told to use the gateway's broker."""

    @property
    def transport(self) -> str:
        """What stock firmware will use: MQTT whenever the reply has an ``mqtt`` section."""
        return "mqtt" if "mqtt" in self.reply else "websocket"


def proxied_reply(
    theirs: Mapping[str, Any],
    own_websocket: Mapping[str, Any],
    own_mqtt: Mapping[str, Any] | None = None,
    mqtt: MqttUpstreams | None = None,
) -> ProxiedReply:
    """Rewrite the upstream's OTA reply ``theirs`` for the device.

    Args:
        theirs: the upstream's reply.
        own_websocket: the gateway's ``websocket`` section for this device (``url``, ``token``).
        own_mqtt: the gateway's ``mqtt`` section for this device; None when it has no broker.
        mqtt: the MQTT half of the proxy; None leaves an upstream ``mqtt`` section out.

    Raises:
        UpstreamSettingsError: no connection section the gateway can proxy, or an unusable one.
    """
    reply = {key: value for key, value in theirs.items() if key not in _CONNECTIONS}
    websocket = kept_mqtt = None
    if "websocket" in theirs:
        websocket = parse_upstream_websocket(theirs["websocket"])
        section = theirs["websocket"]
        assert isinstance(section, Mapping)  # parse_upstream_websocket checked it
        reply["websocket"] = {**section, "url": own_websocket["url"],
                              "token": own_websocket["token"]}  # fmt: skip
    if "mqtt" in theirs and own_mqtt is not None and mqtt is not None:
        if not isinstance(theirs["mqtt"], Mapping):
            raise UpstreamSettingsError("the upstream's mqtt section is not a JSON object")
        kept_mqtt = theirs["mqtt"]
        reply["mqtt"] = mqtt.device_section(kept_mqtt, own_mqtt)
    if websocket is None and kept_mqtt is None:
        offered = [name for name in _CONNECTIONS if name in theirs]
        why = (
            "only mqtt, and the gateway has no MQTT broker to proxy it (set [mqtt] listen)"
            if offered == ["mqtt"]
            else "neither websocket nor mqtt"
        )
        raise UpstreamSettingsError(f"the upstream's reply offers {why}")
    return ProxiedReply(reply, websocket, kept_mqtt)
