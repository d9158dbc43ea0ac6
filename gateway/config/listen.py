"""Addresses to listen on: ``host:port`` as the settings write it, and which are loopback."""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass

from gateway.config.values import string
from gateway.errors import ConfigError


# Asked for every device session (where its camera uploads): a handful of hosts, bounded.
@functools.lru_cache(maxsize=256)
def is_loopback_host(host: str) -> bool:
    """True for a host name or address only this machine can reach."""
    if host.lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class ListenAddress:
    """A ``host:port`` to listen on."""

    host: str
    port: int

    @property
    def is_loopback(self) -> bool:
        """True when only this machine can reach the address."""
        return is_loopback_host(self.host)

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def listen(key: str, value: object) -> ListenAddress:
    """A ``host:port`` setting (an IPv6 host in brackets or not)."""
    text = string(key, value).strip()
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ConfigError(key, f"expected host:port, got {text!r}")
    try:
        number = int(port)
    except ValueError:
        raise ConfigError(key, f"port must be a number, got {port!r}") from None
    if not 0 <= number <= 65535:
        raise ConfigError(key, f"port must be 0..65535, got {number}")
    return ListenAddress(host.strip("[]"), number)


def optional_listen(key: str, value: object) -> ListenAddress | None:
    """A ``host:port`` setting, or None for ``off`` (the listener is not started)."""
    if isinstance(value, str) and value.strip().lower() in ("off", "none", ""):
        return None
    return listen(key, value)
