"""What a proxied device's voice server told it, kept for the gateway's side of the proxy.

The upstream's OTA reply names where the device should connect (``websocket{url, token,
version}``, ``mqtt{...}``); the device is told to connect to the gateway instead, and the
gateway connects there on its behalf. A device checks in through OTA only at boot, so these
settings are kept in the data dir as well as in memory (``upstream_websocket.json``, mode 0600:
the token opens the device's account on the voice server).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

from gateway.config import is_loopback_host
from gateway.datadir import create_private

__all__ = [
    "KeptSettings",
    "UpstreamSettingsError",
    "UpstreamWebSocket",
    "WebSocketUpstreams",
    "check_destination",
    "parse_upstream_websocket",
    "server_of",
]

logger = logging.getLogger(__name__)

T = TypeVar("T", bound="DataclassInstance")

_MAX_TEXT = 1024  # a longer URL or token is not one the gateway will present anywhere
_STORE_FILE = "upstream_websocket.json"


class UpstreamSettingsError(ValueError):
    """A section of the upstream's OTA reply cannot be used (one sentence says why)."""


@dataclass(frozen=True, slots=True)
class UpstreamWebSocket:
    """Where and how the gateway opens a device's upstream WebSocket, as the device would have."""

    url: str
    token: str | None = field(repr=False)
    version: int = 1  # the binary protocol version (docs/protocol.md §1): relayed, never decoded

    @property
    def where(self) -> str:
        """``scheme://host[:port]``, for log lines (never the token or a query)."""
        return server_of(self.url)


def server_of(url: str) -> str:
    """``scheme://host[:port]`` of ``url``: what logs and listings name (never a token)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # e.g. an unclosed "[": a URL a voice server gave, named in a log line
        return "(a malformed URL)"
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def check_destination(url: str, ota_url: str) -> None:
    """Refuse ``url``, given by the voice server at ``ota_url``, if it leads where it has no say.

    The gateway follows the URLs a voice server hands it (its WebSocket, its camera's upload URL)
    from the gateway's own host, with the device's traffic. One naming this machine (loopback,
    0.0.0.0) would reach the gateway's host listener and whatever else listens on loopback; a
    link-local one reaches cloud metadata services. Such a URL is followed only when the
    operator's own ``ota_url`` leads to the same place (a voice server on the same machine).
    Host names are not resolved: this guards what the server says, not what DNS answers.

    Raises:
        UpstreamSettingsError: ``url`` is malformed or leads there.
    """
    try:
        where = _local_reach(urllib.parse.urlsplit(url).hostname)
        allowed = _local_reach(urllib.parse.urlsplit(ota_url).hostname)
    except ValueError:
        raise UpstreamSettingsError(f"the upstream's URL {server_of(url)} is malformed") from None
    if where is not None and where != allowed:
        raise UpstreamSettingsError(
            f"the upstream's URL {server_of(url)} points at {where}; the gateway follows such a "
            "URL only when [upstream] ota_url points there too"
        )


def _local_reach(host: str | None) -> str | None:
    """Where ``host`` leads if a voice server has no business naming it, else None."""
    if not host or is_loopback_host(host) or host.endswith(".localhost"):
        return "this machine" if host else None
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None  # a name (see check_destination)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback or address.is_unspecified:
        return "this machine"
    return "the link-local network" if address.is_link_local else None


def parse_upstream_websocket(section: object) -> UpstreamWebSocket:
    """Read the ``websocket`` section of an upstream OTA reply.

    Raises:
        UpstreamSettingsError: not an object, or no ``ws://``/``wss://`` URL with a host.
    """
    if not isinstance(section, Mapping):
        raise UpstreamSettingsError("the upstream's websocket section is not a JSON object")
    url = section.get("url")
    if not isinstance(url, str) or not 0 < len(url) <= _MAX_TEXT:
        raise UpstreamSettingsError("the upstream's websocket.url is missing or not a string")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises on a port out of range
    except ValueError:
        raise UpstreamSettingsError(
            f"the upstream's websocket.url {server_of(url)} is malformed"
        ) from None
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise UpstreamSettingsError(
            f"the upstream's websocket.url {server_of(url)} is not ws:// or wss://"
        )
    token = section.get("token")
    if token is not None and (
        not isinstance(token, str) or len(token) > _MAX_TEXT or not token.isprintable()
    ):  # it becomes a header line of the upstream handshake: no CR, LF or other control
        raise UpstreamSettingsError("the upstream's websocket.token is not a usable string")
    version = section.get("version", 1)
    if type(version) is not int or version not in (1, 2, 3):
        raise UpstreamSettingsError(f"the upstream's websocket.version {version!r} is not 1, 2, 3")
    return UpstreamWebSocket(url, token or None, version)


class KeptSettings(Generic[T]):
    """Settings of each proxied device, by device id, kept in a data dir file (mode 0600).

    ``parse`` reads back one stored entry (``asdict`` of the settings) and raises
    ``UpstreamSettingsError`` or ``TypeError`` when it cannot; such an entry is skipped.
    """

    def __init__(self, path: Path, parse: Callable[[object], T]) -> None:
        self._path = path
        self._parse = parse
        self._settings: dict[str, T] = {}
        self._load()

    def get(self, device_id: str) -> T | None:
        """The settings of ``device_id``, or None if it has none (not proxied this way)."""
        return self._settings.get(device_id.lower())

    def items(self) -> list[tuple[str, T]]:
        """Every kept device id with its settings, by device id."""
        return sorted(self._settings.items())

    def put(self, device_id: str, settings: T | None) -> None:
        """Keep (or, with None, forget) the settings of ``device_id``; saved when they changed.

        Raises:
            OSError: the file cannot be written (a full disk); nothing changed, in memory either,
                so the next check-in writes it again.
        """
        device_id = device_id.lower()
        before = self._settings.get(device_id)
        if before == settings:
            return  # every boot checks in: the file is written only when something changed
        self._set(device_id, settings)
        try:
            self._save()
        except OSError:
            self._set(device_id, before)
            raise

    def _set(self, device_id: str, settings: T | None) -> None:
        if settings is None:
            self._settings.pop(device_id, None)
        else:
            self._settings[device_id] = settings

    def _load(self) -> None:
        try:
            data = json.loads(self._path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            logger.warning("%s is unreadable (%s): devices get their upstream again at their "
                           "next boot", self._path, exc)  # fmt: skip
            return
        for device_id, raw in data.items() if isinstance(data, dict) else ():
            try:
                self._settings[device_id] = self._parse(raw)
            except (UpstreamSettingsError, TypeError) as exc:
                logger.warning("%s: the entry of %s is unusable (%s); skipped",
                               self._path, device_id, exc)  # fmt: skip

    def _save(self) -> None:
        data = {device_id: asdict(s) for device_id, s in sorted(self._settings.items())}
        temporary = create_private(self._path.with_suffix(".tmp"))
        temporary.write_text(json.dumps(data, indent=1))
        os.replace(temporary, self._path)  # a crash mid-write leaves the old file whole


class WebSocketUpstreams(KeptSettings[UpstreamWebSocket]):
    """The upstream WebSocket of every proxied device, by device id (data dir, mode 0600)."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir / _STORE_FILE, parse_upstream_websocket)
