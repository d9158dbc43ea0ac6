"""Events that ``DeviceProtocol`` emits as it digests what a device sends.

Each event is a frozen, slotted dataclass. The I/O layer reads them with
``DeviceProtocol.events_received()`` and acts on them; the core itself never does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CallFailed",
    "CallSucceeded",
    "DeviceGoodbye",
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

    ``tools`` is the device's complete catalogue in device order, every entry a dict with a string
    ``name``, a string ``description`` and an object ``inputSchema`` (plus ``annotations`` when the
    device sent them). ``server_info`` is the device's ``initialize`` ``serverInfo`` when it gave
    one. ``complete`` is False when listing stopped early (a cursor loop, a page error, the page
    limit); ``tools`` then holds what was gathered before that.
    """

    tools: tuple[JsonObject, ...]
    server_info: JsonObject | None = None
    complete: bool = True


@dataclass(frozen=True, slots=True)
class CallSucceeded:
    """The device answered the ``tools/call`` with request id ``call_id``."""

    call_id: int
    result: JsonObject


@dataclass(frozen=True, slots=True)
class CallFailed:
    """The device answered the ``tools/call`` with request id ``call_id`` with an error.

    ``code`` is None when the device's error had none (stock firmware never sends one).
    """

    call_id: int
    message: str
    code: int | None = None


@dataclass(frozen=True, slots=True)
class DeviceGoodbye:
    """The device announced it is closing the session (MQTT ``goodbye``)."""


@dataclass(frozen=True, slots=True)
class MessageDropped:
    """Something the device sent was ignored; ``reason`` says why (for logs, never fatal)."""

    reason: str
    detail: JsonObject = field(default_factory=dict)


Event = HelloReceived | ToolsListed | CallSucceeded | CallFailed | DeviceGoodbye | MessageDropped
