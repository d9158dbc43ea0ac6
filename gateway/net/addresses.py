"""Addresses clients can use: the one home for "a listener's bind address -> where to connect".

A listener bound to a wildcard (``0.0.0.0``, ``::`` or empty) accepts on every interface, but no
client can connect to a wildcard. On this machine (the CLI, ``doctor``, the gateway's own MQTT
client) the answer is loopback: ``127.0.0.1`` for ``0.0.0.0`` and ``::1`` for ``::``, since a
``::`` socket may be IPv6-only, and ``::1`` reaches it either way. Devices and MCP hosts on the
LAN need this machine's LAN address instead: ``device_url`` when configured, else the bind
address when it names one, else the address this machine's default route leaves from
(``Addresses.board_base``, the one home for "the address boards are told"); in a container
that address is the container network's, so none is known there.

``Addresses`` is built from the config and, once the gateway listens, the ports really bound
(port 0 in tests); OTA, ``doctor``, the start-up lines, the broker and flashing read it.
"""

from __future__ import annotations

import functools
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from gateway.config import Config, ListenAddress, is_loopback_host
from gateway.launch import in_container, in_home_assistant

__all__ = [
    "DEVICE_PATH",
    "UNKNOWN_LAN",
    "Addresses",
    "host_port",
    "http_url",
    "is_wildcard",
    "lan_address",
    "local_host",
    "url_host",
    "websocket_url",
]

DEVICE_PATH = "/xiaozhi/v1/"
# What boards are told when no address of this machine is known to reach it.
UNKNOWN_LAN = "(set device_url, GATEWAY_DEVICE_URL: this machine's LAN address is unknown)"
_WILDCARDS = frozenset({"0.0.0.0", "::", ""})
# Any routable address outside the LAN: connecting a UDP socket sends nothing, it only picks
# the interface (and so the source address) the default route would use.
_ROUTE_PROBE = ("192.0.2.1", 9)  # TEST-NET-1 (RFC 5737)


def is_wildcard(host: str) -> bool:
    """True for a bind address meaning "every interface"."""
    return host.strip("[]") in _WILDCARDS


def local_host(host: str) -> str:
    """The host a client on this machine uses for a listener bound to ``host``."""
    host = host.strip("[]")
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    return "::1" if host == "::" else host


def url_host(host: str) -> str:
    """``host`` as it goes into a URL or ``host:port`` (IPv6 literals in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def host_port(host: str, port: int) -> str:
    """``host:port``, IPv6 literals in brackets."""
    return f"{url_host(host)}:{port}"


@functools.cache
def lan_address() -> str | None:
    """This machine's address on its LAN (the default route's source), else its host name.

    None in our image (Docker, the Home Assistant add-on): a container's address is its own
    network's (172.x), which no board on the LAN can reach, and the Docker host's is unknown.
    """
    if in_container() or in_home_assistant():
        return None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(_ROUTE_PROBE)
            address = str(probe.getsockname()[0])
        if not is_wildcard(address) and not is_loopback_host(address):
            return address
    except OSError:
        pass  # no route at all: an offline machine or a bare container
    name = socket.gethostname()
    return name if name and not is_loopback_host(name) else None


@dataclass(frozen=True, slots=True)
class Addresses:
    """Where clients reach this gateway's listeners.

    ``device_port``, ``host_port`` and ``mqtt_port`` are the ports really bound (the configured
    ones until the gateway listens). ``lan`` is this machine's LAN address (``lan_address()``).
    """

    config: Config
    device_port: int
    host_port: int
    mqtt_port: int | None
    lan: str | None

    @classmethod
    def of(
        cls,
        config: Config,
        *,
        device_port: int | None = None,
        host_port: int | None = None,
        mqtt_port: int | None = None,
        lan: str | None = None,
    ) -> Addresses:
        """The addresses of ``config``, with the bound ports where known."""
        if mqtt_port is None and config.mqtt_broker == "embedded" and config.mqtt_listen:
            mqtt_port = config.mqtt_listen.port
        return cls(
            config,
            device_port or config.device_listen.port,
            host_port or config.host_listen.port,
            mqtt_port,
            lan,
        )

    # --- for clients on this machine -----------------------------------------------------------

    def local(self, listen: ListenAddress, port: int) -> str:
        """``host:port`` a client on this machine uses for ``listen`` (bound to ``port``)."""
        return host_port(local_host(listen.host), port)

    @property
    def local_host_url(self) -> str:
        """The host listener's base URL on this machine (CLI commands, ``flash``)."""
        return f"http://{self.local(self.config.host_listen, self.host_port)}"

    @property
    def local_device_url(self) -> str:
        """The device WebSocket URL on this machine (the simulator's default)."""
        return f"ws://{self.local(self.config.device_listen, self.device_port)}{DEVICE_PATH}"

    # --- for devices and MCP hosts on the LAN ---------------------------------------------------

    def lan_host(self, listen: ListenAddress) -> str:
        """The host others on the LAN use for ``listen``: its own address, else the LAN's."""
        if not is_wildcard(listen.host):
            return listen.host
        return self.lan or lan_address() or local_host(listen.host)

    def device_base(self) -> tuple[str, str, int]:
        """``(scheme, host, port)`` devices are sure to reach: ``device_url``, else the bind.

        A wildcard bind gives the loopback host here, not a guessed LAN address: what is written
        into a device (``flash``) must be known to work or left to the user.
        """
        url = self.config.public_url
        parts = urlsplit(url) if url else None
        if parts is not None and parts.hostname:
            port = parts.port or (443 if parts.scheme == "https" else 80)
            return parts.scheme, parts.hostname, port
        return "http", local_host(self.config.device_listen.host), self.device_port

    def board_base(self, seen: str | None = None) -> tuple[str, str, int] | None:
        """``(scheme, host, port)`` to tell a person to give a board; None when none is known.

        The device URL when configured; else ``seen`` (a name of this machine that is known to
        reach it, Home Assistant's host name under its ingress); else the bind address when it
        names one; else this machine's LAN address. Never loopback for a wildcard bind: a board
        told 127.0.0.1 connects to itself and never checks in.
        """
        if self.config.public_url:
            return self.device_base()
        listen = self.config.device_listen
        if seen:
            return "http", seen, self.device_port
        host = (self.lan or lan_address()) if is_wildcard(listen.host) else listen.host
        return ("http", host, self.device_port) if host else None

    @property
    def device_url(self) -> str:
        """The device WebSocket URL to tell people, else what to set (``UNKNOWN_LAN``)."""
        base = self.board_base()
        return websocket_url(*base) if base else UNKNOWN_LAN

    @property
    def mcp_url(self) -> str:
        """The streamable-HTTP MCP URL for hosts: loopback stays loopback, a wildcard the LAN's."""
        host = self.config.host_listen
        where = host_port(self.lan_host(host), self.host_port)
        return f"http://{where}/mcp"

    @property
    def mqtt_endpoint(self) -> str | None:
        """The broker ``host:port`` for devices; None when MQTT is off."""
        config = self.config
        if config.mqtt_public_endpoint:
            return config.mqtt_public_endpoint
        if config.mqtt_broker == "external":
            return host_port(config.mqtt_host, config.mqtt_port)
        if config.mqtt_broker == "embedded" and config.mqtt_listen and self.mqtt_port:
            host = self.device_base()[1] if config.public_url else None
            return host_port(host or self.lan_host(config.mqtt_listen), self.mqtt_port)
        return None


def http_url(scheme: str, host: str, port: int) -> str:
    """The http(s) base URL ``scheme://host[:port]`` (default ports left out)."""
    default = 443 if scheme == "https" else 80
    return f"{scheme}://{host_port(host, port) if port != default else url_host(host)}"


def websocket_url(scheme: str, host: str, port: int) -> str:
    """The device WebSocket URL for an http(s) base (default ports left out)."""
    return f"ws{http_url(scheme, host, port).removeprefix('http')}{DEVICE_PATH}"
