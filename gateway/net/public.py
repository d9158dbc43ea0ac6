"""Where devices reach this gateway: the public address of the device listener and the broker.

``device_url`` when configured, else the address the device itself used to reach the OTA
endpoint (its ``Host`` header, right even behind Docker port mapping), else the device
listener's address. Advertising loopback to LAN devices is warned. Both sides need it: the
device side hands it to devices, the host side shows it on the dashboard's Setup page.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from gateway.config import Config, is_loopback_host
from gateway.errors import ConfigError
from gateway.net.addresses import Addresses, host_port, websocket_url

__all__ = ["OTA_PATH", "PublicAddress", "split_host"]

OTA_PATH = "/xiaozhi/ota/"


class PublicAddress:
    """Where devices reach this gateway's device listener and broker."""

    def __init__(self, config: Config) -> None:
        self._config = config
        # The listeners' real ports replace the configured ones once the gateway listens.
        self.addresses = Addresses.of(config)
        self.seen: tuple[str, int] | None = None  # the host:port the last device used
        url = config.public_url
        parts = urlsplit(url) if url else None
        if parts is not None and (parts.scheme not in ("http", "https") or not parts.hostname):
            raise ConfigError("device_url", f"expected http(s)://host[:port], got {url!r}")
        self._configured = parts

    def warnings(self) -> list[str]:
        """What is wrong with the configured addresses for devices on the LAN."""
        config, problems = self._config, []
        lan = not config.device_listen.is_loopback
        parts = self._configured
        if lan and parts is not None and is_loopback_host(parts.hostname or ""):
            problems.append(
                f"device_url {config.public_url} is a loopback address, but devices are expected "
                "on the LAN: they would be told to connect to themselves; set it to this "
                "machine's LAN address"
            )
        if config.mqtt_broker == "external" and not config.mqtt_public_endpoint:
            if is_loopback_host(config.mqtt_host):
                problems.append(
                    f"mqtt.host {config.mqtt_host} is loopback: stock devices would be told to use "
                    "it; set mqtt.public_endpoint to the broker's LAN address"
                )
        return problems

    def device_base(self, host_header: str | None = None) -> tuple[str, str, int]:
        """``(scheme, host, port)`` of the device listener as devices should use it."""
        if self._configured is None:
            if host_header:
                host, seen_port = split_host(host_header)
                if host:
                    return "http", host, seen_port or 80
            if self.seen is not None:
                return "http", *self.seen
        scheme, host, port = self.addresses.device_base()
        return scheme, host, port or 8765

    def websocket_url(self, host_header: str | None = None) -> str:
        """The device WebSocket URL to advertise."""
        return websocket_url(*self.device_base(host_header))

    def mqtt_endpoint(self, broker_port: int | None, host_header: str | None = None) -> str:
        """The broker ``host:port`` to give stock devices."""
        config = self._config
        if config.mqtt_public_endpoint:
            return config.mqtt_public_endpoint
        if config.mqtt_broker == "external" or broker_port is None:
            return host_port(config.mqtt_host, config.mqtt_port)
        return host_port(self.device_base(host_header)[1], broker_port)


def split_host(text: str) -> tuple[str, int | None]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or host.endswith(":") or (host.startswith("[") != host.endswith("]")):
        return text.strip().strip("[]"), None  # no port (or a bare IPv6 address)
    return host.strip("[]"), int(port) if port.isdigit() else None
