"""An MQTT device's upstream: the ``mqtt`` section its voice server gave it, kept per device.

When the upstream's OTA reply carries ``mqtt`` (xiaozhi.me always does; stock firmware then
prefers MQTT, docs/protocol.md §0), the device is told to log in to the gateway's broker with
gateway-issued credentials (``device_mqtt_section``), and the upstream's own settings are kept
for the gateway's upstream client (``MqttUpstreams``). They are kept in the data dir
(``upstream_mqtt.json``, mode 0600: they hold the upstream's password) because a device checks in
through OTA only at boot, while it reconnects to the broker after every gateway restart.

The endpoint is read the way stock firmware reads it (``mqtt_protocol.cc``): ``host`` or
``host:port``, port 8883 when absent, TLS exactly when the port is 8883.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.device_side.upstream.settings import KeptSettings, UpstreamSettingsError

__all__ = [
    "TLS_PORT",
    "UpstreamMqtt",
    "MqttUpstreams",
    "device_mqtt_section",
    "parse_upstream_mqtt",
]

logger = logging.getLogger(__name__)

TLS_PORT = 8883  # stock firmware: TLS exactly on this port, and it is the port when none is given
_KEEPALIVE = 240  # seconds, the stock default
_MAX_TEXT = 512  # a longer field is not a broker setting the gateway can use
_STORE_FILE = "upstream_mqtt.json"


@dataclass(frozen=True, slots=True)
class UpstreamMqtt:
    """How the gateway logs in to a device's upstream broker, as the device would have."""

    host: str
    port: int
    client_id: str
    username: str | None
    password: str | None = field(repr=False)
    publish_topic: str
    subscribe_topic: str | None  # None: the upstream pushes to the client unasked (xiaozhi.me)
    keepalive: int = _KEEPALIVE

    @property
    def tls(self) -> bool:
        """True when the device would have used TLS (port 8883)."""
        return self.port == TLS_PORT

    @property
    def server(self) -> str:
        """``mqtt[s]://host:port``: how listings and the dashboard name it."""
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"

    @property
    def where(self) -> str:
        """``host:port``, for log lines (never the credentials)."""
        return f"{self.host}:{self.port}"


def parse_upstream_mqtt(section: object) -> UpstreamMqtt:
    """Read the ``mqtt`` section of an upstream OTA reply.

    Raises:
        UpstreamSettingsError: it is not an object, or lacks what a device needs to connect.
    """
    if not isinstance(section, Mapping):
        raise UpstreamSettingsError("the upstream's mqtt section is not a JSON object")
    endpoint = _text(section, "endpoint", required=True)
    assert endpoint is not None
    host, sep, port_text = endpoint.rpartition(":")
    if not sep:
        host, port_text = endpoint, str(TLS_PORT)
    if not host or "/" in host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise UpstreamSettingsError(f"the upstream's mqtt endpoint {endpoint!r} is not host[:port]")
    publish_topic = _text(section, "publish_topic", required=True)
    subscribe_topic = _text(section, "subscribe_topic")
    keepalive = section.get("keepalive")
    return UpstreamMqtt(
        host=host,
        port=int(port_text),
        client_id=_text(section, "client_id", required=True) or "",
        username=_text(section, "username"),
        password=_text(section, "password"),
        publish_topic=publish_topic or "",
        # xiaozhi.me says "null" (a string): nothing to subscribe to, it pushes unasked.
        subscribe_topic=None if subscribe_topic in (None, "", "null") else subscribe_topic,
        keepalive=keepalive if type(keepalive) is int and 10 <= keepalive <= 3600 else _KEEPALIVE,
    )


def _text(section: Mapping[str, Any], key: str, *, required: bool = False) -> str | None:
    value = section.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value or len(value) > _MAX_TEXT:
        raise UpstreamSettingsError(f"the upstream's mqtt.{key} is missing or not a usable string")
    if any(c in value for c in "+#\0") and key.endswith("topic"):
        raise UpstreamSettingsError(f"the upstream's mqtt.{key} {value!r} is not a topic name")
    return value


def device_mqtt_section(upstream: Mapping[str, Any], own: Mapping[str, Any]) -> dict[str, Any]:
    """The ``mqtt`` section the device gets when its upstream answered with ``upstream``.

    ``own``: what the gateway hands a device of its own (its broker's endpoint on a non-TLS
    port, the device's gateway credentials, ``publish_topic``, ``keepalive``), and nothing of the
    upstream's: the firmware reads no other key, and every key it gets lands in its NVS, where
    an unknown one could only do harm (docs/protocol.md §7.1).

    Raises:
        UpstreamSettingsError: the gateway cannot log in where ``upstream`` says.
    """
    parse_upstream_mqtt(upstream)
    return dict(own)


class MqttUpstreams(KeptSettings[UpstreamMqtt]):
    """The upstream MQTT settings of every proxied device, by device id, in the data dir (0600).

    The OTA endpoint's MQTT half (``ota_reply.MqttUpstreams``): ``device_section`` rewrites the
    section the device gets, ``keep`` stores the upstream's once the whole reply passed.
    """

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir / _STORE_FILE, _stored)

    def device_section(self, theirs: Mapping[str, Any], own: Mapping[str, Any]) -> dict[str, Any]:
        """The ``mqtt`` section the device gets (``device_mqtt_section``).

        Raises:
            UpstreamSettingsError: the gateway cannot log in where the upstream says.
        """
        return device_mqtt_section(theirs, own)

    def keep(self, device_id: str, theirs: Mapping[str, Any] | None) -> None:
        """Keep (None: forget) the upstream's ``mqtt`` section for the gateway's client.

        Raises:
            UpstreamSettingsError: the section cannot be used.
        """
        self.put(device_id, None if theirs is None else parse_upstream_mqtt(theirs))


def _stored(raw: object) -> UpstreamMqtt:
    """An entry of the file back (``asdict`` of the settings; the file is the gateway's own)."""
    if not isinstance(raw, dict):
        raise UpstreamSettingsError("not an object")
    return UpstreamMqtt(**raw)
