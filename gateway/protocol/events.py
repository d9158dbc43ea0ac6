"""Events that ``DeviceProtocol`` emits as it digests what a device sends.

Each event is a frozen, slotted dataclass. The I/O layer reads them with
``DeviceProtocol.events_received()`` and acts on them; the core itself never does I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CallFailed",
    "CallSucceeded",
    "DeviceGoodbye",
    "DeviceLogged",
    "DiscoveryTimedOut",
    "Event",
    "HelloReceived",
    "MessageDropped",
    "ToolsListed",
]

JsonObject = dict[str, Any]


@dataclass(frozen=True, slots=True)
class HelloReceived:
    """The device said hello; the server hello is already queued in ``data_to_send()``."""

    hello: JsonObject


@dataclass(frozen=True, slots=True)
class ToolsListed:
    """Discovery (or a re-listing after ``notifications/tools/list_changed``) finished.

    ``tools`` is the device's complete catalogue in device order, each entry exactly as the device
    sent it (any JSON value: the device layer judges them one by one). ``server_info`` is the
    device's ``initialize`` ``serverInfo`` when it gave one. ``complete`` is False when listing
    stopped early (a cursor loop, a page error, the page limit); ``tools`` then holds what was
    gathered before that. ``digest`` names the pages' content when every page came framed as
    stock firmware frames it (``ToolCatalog.digest``): equal digests, equal ``tools``.
    """

    tools: Sequence[object]  # a tuple, or the catalog's Entries (parsed on first use)
    server_info: JsonObject | None = None
    complete: bool = True
    digest: str | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class CallSucceeded:
    """The device answered the ``tools/call`` with request id ``call_id``."""

    call_id: int
    result: JsonObject


@dataclass(frozen=True, slots=True)
class CallFailed:
    """The ``tools/call`` with request id ``call_id`` ended without a result.

    Either the device answered with an error (``code`` is None when it had none: stock firmware
    never sends one), or the session closed before the answer came (``closed`` is True).
    """

    call_id: int
    message: str
    code: int | None = None
    closed: bool = False


@dataclass(frozen=True, slots=True)
class DeviceGoodbye:
    """The device announced it is closing the session (MQTT ``goodbye``)."""


@dataclass(frozen=True, slots=True)
class DeviceLogged:
    """The device sent an MCP logging notification: an event of the device (``device_log``).

    ``logger`` is "" when the device named none; ``data`` is any JSON value, bounded, and
    ``cut`` says it was cut to its bound.
    """

    level: str
    logger: str
    data: object
    cut: bool = False


@dataclass(frozen=True, slots=True)
class DiscoveryTimedOut:
    """Discovery did not finish within ``seconds``; the session is closed (close the link)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class MessageDropped:
    """Something the device sent was ignored; ``reason`` says why (for logs, never fatal)."""

    reason: str
    detail: JsonObject = field(default_factory=dict)


Event = (
    HelloReceived
    | ToolsListed
    | CallSucceeded
    | CallFailed
    | DeviceGoodbye
    | DeviceLogged
    | DiscoveryTimedOut
    | MessageDropped
)
