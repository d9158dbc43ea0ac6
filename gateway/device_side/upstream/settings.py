"""What a proxied device's voice server told it, kept for the gateway's side of the proxy.

The upstream's OTA reply names where the device should connect (``websocket{url, token,
version}``, ``mqtt{...}``); the device is told to connect to the gateway instead, and the
gateway connects there on its behalf. A device checks in through OTA only at boot, so these
settings are kept in the data dir as well as in memory (``upstream_websocket.json``, mode 0600:
the token opens the device's account on the voice server).
"""

from __future__ import annotations

import contextlib
import logging
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from websockets.exceptions import InvalidURI
from websockets.uri import parse_uri

from gateway.datadir import KeptJson
from gateway.errors import StorageUnavailable
from gateway.net.destinations import (
    Destination,
    DestinationRefused,
    literal_reach,
    reach_of,
    resolve_destination,
)

__all__ = [
    "SERVER_HELLO_SECONDS",
    "SERVER_MESSAGE_BYTES",
    "KeptSettings",
    "UpstreamSettingsError",
    "UpstreamWebSocket",
    "WebSocketUpstreams",
    "check_destination",
    "check_followed",
    "check_websocket_url",
    "destination_of",
    "parse_upstream_websocket",
    "server_of",
]

logger = logging.getLogger(__name__)


class _Dataclass(Protocol):
    """Any dataclass instance, as ``dataclasses.asdict`` takes it."""

    __dataclass_fields__: ClassVar[dict[str, Any]]


T = TypeVar("T", bound=_Dataclass)

_MAX_TEXT = 1024  # a longer URL or token is not one the gateway will present anywhere
_STORE_FILE = "upstream_websocket.json"
SERVER_MESSAGE_BYTES = 256 * 1024
"""The largest server->device message relayed, on both transports (never less than the
gateway's own ``max_message_bytes``): since 2026 ``tts``/``stt`` messages may carry
``glyph_push`` bitmaps of up to 64 KiB in base64, JSON text of about 100 KB."""
SERVER_HELLO_SECONDS = 12.0
"""How long the gateway's own session on a proxied WebSocket waits for the server's hello to
reach the device: the device waits 10 s for it (docs/protocol.md §8.2), then hangs up."""
_DEFAULT_PORTS = {"ws": 80, "wss": 443, "http": 80, "https": 443, "mqtt": 1883, "mqtts": 8883}


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
    """Refuse ``url``, given by the voice server at ``ota_url``, if it is unusable as written.

    The gateway follows the URLs a voice server hands it (its WebSocket, its camera's upload URL,
    its MQTT broker) from the gateway's own host, with the device's traffic. User info would put
    a second ``Authorization`` beside the gateway's own, and spaces or control characters would
    change the request line: such a URL is refused. A literal address naming this machine or the
    link-local network is refused here already; every other spelling, and every host name, is
    checked once resolved, as the connection is made (``destination_of``).

    Raises:
        UpstreamSettingsError: ``url`` is malformed or leads there.
    """
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname
        ota_host = urllib.parse.urlsplit(ota_url).hostname
    except ValueError:
        raise UpstreamSettingsError(f"the upstream's URL {server_of(url)} is malformed") from None
    if not url.isprintable() or " " in url:
        raise UpstreamSettingsError(
            f"the upstream's URL {server_of(url)} has spaces or control characters"
        )
    if "@" in parts.netloc:
        raise UpstreamSettingsError(f"the upstream's URL {server_of(url)} carries user info")
    where = literal_reach(host) if host else None
    if where is not None and where != (literal_reach(ota_host) if ota_host else None):
        raise UpstreamSettingsError(_leads_to(url, where))


async def destination_of(url: str, ota_url: str) -> Destination:
    """Where to connect for ``url``, given by the voice server at ``ota_url``: checked as resolved.

    The host is resolved once; the connection goes to the address returned, so a second DNS
    answer cannot lead elsewhere. Like ``check_destination``, this machine and the link-local
    network are followed only when the operator's own ``ota_url`` leads there too (a voice
    server on the same machine).

    Raises:
        UpstreamSettingsError: ``url`` is unusable or leads where it must not.
        DestinationRefused: its host does not resolve (the server is unreachable).
    """
    check_destination(url, ota_url)
    parts = urllib.parse.urlsplit(url)
    port = parts.port or _DEFAULT_PORTS.get(parts.scheme, 80)
    place = await reach_of(urllib.parse.urlsplit(ota_url).hostname or "")
    try:
        return await resolve_destination(parts.hostname or "", port, allow=[place] if place else [])
    except DestinationRefused as exc:
        if exc.place is None:
            raise
        raise UpstreamSettingsError(_leads_to(url, exc.place)) from None


async def check_followed(url: str, ota_url: str) -> None:
    """``destination_of`` for a check-in: a name that does not resolve from here passes (it is
    checked again, and its failure said, at every connection; DNS may answer by then).

    Raises:
        UpstreamSettingsError: ``url`` is unusable or leads where it must not.
    """
    with contextlib.suppress(DestinationRefused):
        await destination_of(url, ota_url)


def _leads_to(url: str, place: str) -> str:
    return (f"the upstream's URL {server_of(url)} points at {place}; the gateway follows such a "
            "URL only when [upstream] ota_url points there too")  # fmt: skip


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
    check_websocket_url(url)
    token = section.get("token")
    if token is not None and (
        not isinstance(token, str) or len(token) > _MAX_TEXT or not token.isprintable()
    ):  # it becomes a header line of the upstream handshake: no CR, LF or other control
        raise UpstreamSettingsError("the upstream's websocket.token is not a usable string")
    version = section.get("version", 1)
    if type(version) is not int or version not in (1, 2, 3):
        raise UpstreamSettingsError(f"the upstream's websocket.version {version!r} is not 1, 2, 3")
    return UpstreamWebSocket(url, token or None, version)


def check_websocket_url(url: str) -> None:
    """Refuse ``url`` unless the gateway can open its upstream WebSocket there as written.

    The one home of that rule: the check-in (``parse_upstream_websocket``, so nothing unusable
    is kept) and ``open_upstream`` ask it. The last word is websockets' own parser, the one its
    ``connect`` runs (a fragment, RFC 6455 §3, or user info without a password it refuses), so
    a URL that passes here never fails as a conversation starts.

    Raises:
        UpstreamSettingsError: not a ``ws://`` or ``wss://`` URL the gateway can open.
    """
    what = f"the upstream's websocket.url {server_of(url)}"
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises on a port out of range
    except ValueError:
        raise UpstreamSettingsError(f"{what} is malformed") from None
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise UpstreamSettingsError(f"{what} is not ws:// or wss://")
    if parts.fragment:
        raise UpstreamSettingsError(f"{what} has a fragment (#...), which a WebSocket URL "
                                    "cannot have")  # fmt: skip
    try:
        parse_uri(url)
    except InvalidURI as exc:  # its text repeats the URL, query (a token) and all: not logged
        raise UpstreamSettingsError(f"{what} cannot be opened ({exc.msg})") from None
    except ValueError:  # UnicodeError: a host name IDNA cannot encode
        raise UpstreamSettingsError(f"{what} has a host name that cannot be encoded") from None


class KeptSettings(Generic[T]):
    """Settings of each proxied device, by device id, kept in a data dir file (mode 0600).

    ``parse`` reads back one stored entry (``asdict`` of the settings) and raises
    ``UpstreamSettingsError`` or ``TypeError`` when it cannot; such an entry is not used, and
    kept in the file as it was until its device checks in again. A file that cannot be read is
    kept as it is, and nothing is saved over it (``datadir.KeptJson``).
    """

    def __init__(self, path: Path, parse: Callable[[object], T]) -> None:
        self._file = KeptJson(path, dict, "the voice servers' settings of the devices")
        self._parse = parse
        self._settings: dict[str, T] = {}
        self._unusable: dict[str, object] = {}
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
            StorageUnavailable: the file is unreadable (kept as it is): nothing changed.
        """
        device_id = device_id.lower()
        before = self._settings.get(device_id)
        if before == settings and device_id not in self._unusable:
            return  # every boot checks in: the file is written only when something changed
        self._set(device_id, settings)
        unusable = self._unusable.pop(device_id, None)
        try:
            self._save()
        except (OSError, StorageUnavailable):
            self._set(device_id, before)
            if unusable is not None:
                self._unusable[device_id] = unusable
            raise

    def _set(self, device_id: str, settings: T | None) -> None:
        if settings is None:
            self._settings.pop(device_id, None)
        else:
            self._settings[device_id] = settings

    def _load(self) -> None:
        for device_id, raw in self._file.load().items():
            try:
                self._settings[device_id] = self._parse(raw)
            except (UpstreamSettingsError, TypeError) as exc:
                logger.warning("%s: the entry of %s is unusable (%s); kept in the file, not used",
                               self._file.path, device_id, exc)  # fmt: skip
                self._unusable[device_id] = raw

    def _save(self) -> None:
        usable = {device_id: asdict(s) for device_id, s in self._settings.items()}
        self._file.save(dict(sorted({**self._unusable, **usable}.items())))


class WebSocketUpstreams(KeptSettings[UpstreamWebSocket]):
    """The upstream WebSocket of every proxied device, by device id (data dir, mode 0600)."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir / _STORE_FILE, parse_upstream_websocket)
