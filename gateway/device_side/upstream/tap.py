"""``McpTap``: one device's MCP channel, shared by its voice server (the upstream) and the gateway.

Sans-I/O: payloads in, routing decisions out; nothing here sends, awaits or logs. The
transport that relays a proxied device (the WebSocket relay, the MQTT upstream client) unwraps
each ``{"type": "mcp", "payload": ...}`` message and asks the tap where its payload goes:

- ``tap.from_upstream(payload) -> Route``: a JSON-RPC payload the upstream sent toward the
  device. Usually ``Route(to_device=payload)``. The upstream's request ids reach the device
  unchanged, unless one falls into the ids the gateway keeps for itself (``is_gateway_id``):
  that one is remapped into ``REMAPPED_IDS`` and restored on the way back. The upstream's
  ``initialize`` gets ``capabilities.vision`` replaced by the gateway's (when the tap has one),
  and the upstream's own ``{url, token}`` is kept in ``upstream_vision`` for the uploads the
  gateway did not ask for (DESIGN.md "Beside a voice server"; docs/protocol.md §8).
- ``tap.from_device(payload) -> Route``: a payload the device sent. A reply goes to the side
  whose id it carries: the gateway's ids (``GATEWAY_IDS`` and ``PROBE_ID``) to the gateway, a
  remapped id to the upstream with its original id restored, every other id to the upstream.
  A notification (``notifications/tools/list_changed``) goes to both; a request (the device
  never sends one to a server today) to the upstream.

A ``Route`` names up to three destinations; a payload that goes out unchanged is the very
object passed in (``route.to_device is payload``), so the caller can forward the original text
frame byte for byte and re-encode only what the tap rewrote.

Why these ranges (docs/protocol.md §8): the upstream numbers its requests 1, 2, then a counter
from 1 again, and parses reply ids with ``int()``, so it must get back exactly its ids; stock
firmware reads ids as a C ``int`` (cJSON ``valueint``), so every id stays within int32. The
gateway's ``DeviceProtocol`` allocates from ``GATEWAY_IDS`` (``request_ids=GATEWAY_IDS``), far
above any counter a server reaches, and never from the ids remapped here.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.protocol import MAX_REQUEST_ID, PROBE_ID, as_integer

__all__ = ["CANCELLED", "GATEWAY_IDS", "REMAPPED_IDS", "McpTap", "Route", "is_gateway_id"]

JsonObject = dict[str, Any]

GATEWAY_IDS = range(0x4000_0000, 0x6000_0000)
"""The ids of the gateway's own requests to a proxied device."""
REMAPPED_IDS = range(0x6000_0000, MAX_REQUEST_ID + 1)
"""Where an upstream id that collides with the gateway's is moved while its request is open."""
CANCELLED = "notifications/cancelled"
_MAX_REMAPPED = 256  # open remapped requests kept; an upstream never has more than a few


def is_gateway_id(request_id: object) -> bool:
    """True if a reply with ``request_id`` answers the gateway (an int in its ranges, or 0)."""
    number = as_integer(request_id)
    return number is not None and (number == PROBE_ID or number >= GATEWAY_IDS.start)


@dataclass(frozen=True, slots=True)
class Route:
    """Where one payload goes; None means not there."""

    to_device: Any = None
    to_upstream: Any = None
    to_gateway: Any = None


class McpTap:
    """The MCP channel of one proxied device session (see the module docstring)."""

    def __init__(self, vision: Mapping[str, str] | None = None) -> None:
        """Tap a new session.

        Args:
            vision: the gateway's ``{"url", "token"}`` for this device's camera uploads, put
                into the upstream's ``initialize`` in place of its own; None leaves it as is.
        """
        self._vision = dict(vision) if vision is not None else None
        self.upstream_vision: dict[str, str] | None = None
        """The upstream's ``capabilities.vision`` (``url``, and ``token`` if it gave one)."""
        self._remapped: OrderedDict[int, object] = OrderedDict()  # our id -> the upstream's
        self._next_remap = REMAPPED_IDS.start

    @property
    def open_remapped(self) -> int:
        """How many remapped upstream requests wait for the device's reply."""
        return len(self._remapped)

    def from_upstream(self, payload: object) -> Route:
        """Route a JSON-RPC payload the upstream sent toward the device."""
        if not isinstance(payload, dict):
            return Route(to_device=payload)  # the device's to judge, as without the gateway
        method = payload.get("method")
        if isinstance(method, str) and "id" in payload:
            if method == "initialize" and self._vision is not None:
                payload = self._take_vision(payload)
            if is_gateway_id(payload["id"]):
                payload = {**payload, "id": self._remap(payload["id"])}
        elif method == CANCELLED:
            payload = self._cancel_remapped(payload)
        return Route(to_device=payload)

    def from_device(self, payload: object) -> Route:
        """Route a JSON-RPC payload the device sent."""
        if not isinstance(payload, dict):
            return Route(to_upstream=payload)
        if "method" in payload:
            if "id" in payload:
                return Route(to_upstream=payload)  # a request: the device's server answers it
            return Route(to_upstream=payload, to_gateway=payload)  # e.g. tools/list_changed
        request_id = payload.get("id")
        number = as_integer(request_id)
        if number is not None and number in self._remapped:
            original = self._remapped.pop(number)
            return Route(to_upstream={**payload, "id": original})
        if is_gateway_id(request_id) or request_id is None:
            # None: an error the device could not pin on a request; the upstream would choke
            # on int(None), the gateway logs and drops it.
            return Route(to_gateway=payload)
        return Route(to_upstream=payload)

    # --- internals -------------------------------------------------------------------------

    def _take_vision(self, request: JsonObject) -> JsonObject:
        params = request.get("params")
        capabilities = params.get("capabilities") if isinstance(params, dict) else None
        theirs = capabilities.get("vision") if isinstance(capabilities, dict) else None
        if not isinstance(params, dict) or not isinstance(theirs, dict):
            return request  # no camera flow offered: nothing to take over
        url, token = theirs.get("url"), theirs.get("token")
        if isinstance(url, str) and url:
            self.upstream_vision = {"url": url}
            if isinstance(token, str):
                self.upstream_vision["token"] = token
        assert isinstance(capabilities, dict)
        capabilities = {**capabilities, "vision": dict(self._vision or {})}
        return {**request, "params": {**params, "capabilities": capabilities}}

    def _remap(self, original: object) -> int:
        candidate = self._next_remap
        while candidate in self._remapped:  # at most _MAX_REMAPPED are open: this ends
            candidate = _after(candidate)
        self._next_remap = _after(candidate)
        self._remapped[candidate] = original
        while len(self._remapped) > _MAX_REMAPPED:  # unanswered long ago: the device forgot too
            self._remapped.popitem(last=False)
        return candidate

    def _cancel_remapped(self, notification: JsonObject) -> JsonObject:
        params = notification.get("params")
        if not isinstance(params, dict) or not is_gateway_id(params.get("requestId")):
            return notification
        wanted = params["requestId"]
        for ours, original in self._remapped.items():
            if original == wanted:
                return {**notification, "params": {**params, "requestId": ours}}
        return notification


def _after(remapped_id: int) -> int:
    return remapped_id + 1 if remapped_id + 1 in REMAPPED_IDS else REMAPPED_IDS.start
