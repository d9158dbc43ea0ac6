"""``VoiceProxy``: what the gateway keeps to stand between stock devices and their voice servers.

One per gateway, made when ``[upstream]`` names a voice server for some device: the HTTP client
that forwards check-ins, activations and camera uploads (``OtaForwarder``), the upstream settings
of each device (``WebSocketUpstreams``; the MQTT half's as ``mqtt``, with a broker), and the MCP
tap of each live proxied conversation, by device id (the vision forwarder reads the upstream's
camera URL there).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gateway.config import Config
from gateway.device_side.upstream.forwarder import OtaForwarder
from gateway.device_side.upstream.mqtt_settings import MqttUpstreams
from gateway.device_side.upstream.settings import WebSocketUpstreams, server_of
from gateway.device_side.upstream.tap import McpTap
from gateway.devices.device import REJECTED
from gateway.devices.store import DeviceRecord

__all__ = ["VoiceProxy", "server_of"]


class VoiceProxy:
    """The proxy's state (see the module docstring); ``aclose()`` when the gateway stops."""

    def __init__(self, config: Config, data_dir: Path) -> None:
        self.config = config
        self.forwarder = OtaForwarder(config.upstream_timeout)
        self.websockets = WebSocketUpstreams(data_dir)
        # No broker: the OTA reply leaves the upstream's mqtt section out (app: no relays).
        self.mqtt = MqttUpstreams(data_dir) if config.mqtt_broker is not None else None
        self.taps: dict[str, McpTap] = {}
        """The tap of each device's live proxied conversation."""
        self.enders: dict[str, Callable[[], None]] = {}
        """What ends each device's live proxied conversation (WebSocket or MQTT relay)."""

    def on_record(self, device_id: str, record: DeviceRecord | None) -> None:
        """A registry record watcher: a device rejected or forgotten loses its voice server
        too (its conversation ends; admission keeps it from the next)."""
        if record is None or record.state == REJECTED:
            end = self.enders.get(device_id.lower())
            if end is not None:
                end()

    def ota_url(self, device_id: str) -> str | None:
        """The OTA URL of ``device_id``'s voice server, or None when it is not proxied."""
        return self.config.upstream_for(device_id)

    def upstream_vision(self, device_id: str) -> dict[str, str] | None:
        """The camera URL (and token) the upstream gave ``device_id`` in this conversation."""
        tap = self.taps.get(device_id.lower())
        return tap.upstream_vision if tap is not None else None

    async def aclose(self) -> None:
        """Close the forwarder's connections."""
        await self.forwarder.aclose()
