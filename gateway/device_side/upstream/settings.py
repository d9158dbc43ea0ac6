"""What a proxied device's voice server told it, kept for the gateway's side of the proxy.

The upstream's OTA reply names where the device should connect (``websocket{url, token,
version}``, ``mqtt{...}``); the device is told to connect to the gateway instead, and the
gateway connects there on its behalf. A device checks in through OTA only at boot, so these
settings are kept in the data dir as well as in memory (``upstream_websocket.json``, mode 0600:
the token opens the device's account on the voice server).
"""

from __future__ import annotations

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

from gateway.datadir import create_private

__all__ = [
    "KeptSettings",
    "UpstreamSettingsError",
    "UpstreamWebSocket",
    "WebSocketUpstreams",
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
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


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
        raise UpstreamSettingsError(f"the upstream's websocket.url {url!r} is malformed") from None
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise UpstreamSettingsError(f"the upstream's websocket.url {url!r} is not ws:// or wss://")
    token = section.get("token")
    if token is not None and (not isinstance(token, str) or len(token) > _MAX_TEXT):
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

    def put(self, device_id: str, settings: T | None) -> None:
        """Keep (or, with None, forget) the settings of ``device_id``; saved when they changed."""
        device_id = device_id.lower()
        if self._settings.get(device_id) == settings:
            return  # every boot checks in: the file is written only when something changed
        if settings is None:
            self._settings.pop(device_id, None)
        else:
            self._settings[device_id] = settings
        self._save()

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
