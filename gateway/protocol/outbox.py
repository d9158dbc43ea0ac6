"""What one device session hands its I/O layer: text frames to send, and events.

``DeviceProtocol`` fills an ``Outbox`` as it digests input; the I/O layer empties it through
``DeviceProtocol.data_to_send()`` and ``events_received()``. Every frame goes through ``frame()``
(logged as ``>`` when debugging), and every message dropped becomes a ``MessageDropped`` event.
"""

from __future__ import annotations

import logging
from typing import Any

from gateway.protocol import envelope
from gateway.protocol.events import Event, MessageDropped

__all__ = ["Logger", "Outbox"]

JsonObject = dict[str, Any]
Logger = logging.Logger | logging.LoggerAdapter[logging.Logger]


class Outbox:
    """The frames and events one session produced and its I/O layer has not taken yet."""

    def __init__(self, session_id: str, logger: Logger) -> None:
        """Wrap MCP messages in envelopes of ``session_id``; log frames to ``logger``.

        Raises:
            LocalProtocolError: ``session_id`` cannot be sent to a device.
        """
        self.mcp_head = envelope.mcp_head(session_id)  # what each MCP frame starts with
        self.logger = logger
        self.debug = logger.isEnabledFor(logging.DEBUG)
        self.events: list[Event] = []
        self._frames: list[str] = []

    def encode_mcp(self, payload: JsonObject) -> str:
        """The text frame carrying the MCP message ``payload``: what ``envelope.encode`` makes of
        ``{"session_id": ..., "type": "mcp", "payload": payload}``."""
        return f"{self.mcp_head}{envelope.encode(payload)}}}"

    def mcp(self, payload: JsonObject) -> None:
        """Send the MCP message ``payload``."""
        self.frame(self.encode_mcp(payload))

    def frame(self, frame: str) -> None:
        """Send the text frame ``frame``."""
        if self.debug:
            self.logger.debug("> %s", frame)
        self._frames.append(frame)

    def drop(self, reason: str, **detail: Any) -> None:
        """Report a message from the device that is dropped, and why."""
        if self.debug:
            self.logger.debug("dropped: %s %s", reason, detail)
        self.events.append(MessageDropped(reason, detail))

    def take_events(self) -> list[Event]:
        """Return and forget the events produced since the last call."""
        events, self.events = self.events, []
        return events

    def take_frames(self) -> list[str]:
        """Return and forget the frames queued since the last call."""
        frames, self._frames = self._frames, []
        return frames
