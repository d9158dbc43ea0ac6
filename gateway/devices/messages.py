"""Messages to devices (``notify_device``): the stock ``alert`` frame, within the owner's limits.

A message goes to a device as the frame stock xiaozhi firmware already shows (its status bar,
face and chat line, with a sound), ``{"type":"alert","status":S,"message":M,"emotion":E}``,
all three strings, as it requires (reference/xiaozhi-protocol.md §1.1); our firmware shows it
on its screen and beeps where the board has them. Over MQTT a device takes it whenever it is
connected; over WebSocket only while its socket is open (a stock device: during a voice
conversation), else the message is refused as the device not listening now.

Before anything is sent, in this order: the text (not empty, at most ``MAX_MESSAGE``
characters, no control characters), the emotion (one the stock firmware draws), the device
(known, approved), the owner's switch (``messages = false``), its quiet hours (the gateway's
local time), its being online, and its rate (``messages_per_hour``, over the last hour). Each
refusal is a ``CallRejected`` or ``DeviceUnavailable`` with a clear reason, and every message,
sent or refused, leaves an audit record naming its caller, as a call does (tool
``notify_device``).

``clock`` (seconds since the epoch, ``time.time``) is read for both quiet hours and the rate;
tests set it.
"""

from __future__ import annotations

import time
import unicodedata
from collections import deque
from collections.abc import Callable
from typing import Any

from gateway.config import Config
from gateway.devices.audit import AuditLog
from gateway.devices.calls import format_time
from gateway.devices.device import PENDING, REJECTED, Device
from gateway.devices.link import BOARD_TRANSPORT
from gateway.errors import CallRejected, DeviceError, DeviceUnavailable
from gateway.protocol import envelope

__all__ = [
    "DEFAULT_EMOTION",
    "EMOTIONS",
    "MAX_MESSAGE",
    "STATUS",
    "TOOL",
    "Messenger",
    "alert_frame",
]

TOOL = "notify_device"  # the audit records' tool
MAX_MESSAGE = 200  # characters: about what a stock device's chat line shows in a few lines
STATUS = "Notice"  # the status bar's text while the message shows
DEFAULT_EMOTION = "neutral"
# The faces stock firmware draws (xiaozhi-esp32 display emotions); it shows neutral for others.
EMOTIONS = (
    "neutral", "happy", "laughing", "funny", "sad", "angry", "crying", "loving", "embarrassed",
    "surprised", "shocked", "thinking", "winking", "cool", "relaxed", "delicious", "kissy",
    "confident", "sleepy", "silly", "confused",
)  # fmt: skip
_HOUR = 3600.0
_LINE_BREAKS = ("\u2028", "\u2029")  # not Cc, but as disruptive on one chat line


def alert_frame(message: str, emotion: str = DEFAULT_EMOTION, status: str = STATUS) -> str:
    """The ``alert`` frame as the device gets it."""
    return envelope.encode(
        {"type": "alert", "status": status, "message": message, "emotion": emotion}
    )


def text_problem(message: object) -> str | None:
    """Why ``message`` cannot be shown on a device, or None when it can."""
    if not isinstance(message, str) or not message.strip():
        return "`message` must be a non-empty string"
    if len(message) > MAX_MESSAGE:
        return f"the message is {len(message)} characters long; at most {MAX_MESSAGE} fit"
    for char in message:
        if unicodedata.category(char) == "Cc" or char in _LINE_BREAKS:
            return f"the message holds a control character (U+{ord(char):04X}); send plain text"
    return None


class Messenger:
    """Puts messages on devices, within each device's limits, and audits every one."""

    def __init__(self, config: Config, audit: AuditLog) -> None:
        self._config = config
        self._audit = audit
        self.clock: Callable[[], float] = time.time
        # When each device's last messages went (those of the last hour; a device that never
        # got one has no entry).
        self._sent: dict[str, deque[float]] = {}

    async def notify(
        self, device: Device, message: object, emotion: object = None, *, caller: str,
        origin: str | None = None,
    ) -> str:  # fmt: skip
        """Send ``message`` (with ``emotion``) to ``device``; return what was done, in words.

        Raises:
            CallRejected: the message, the device's state or the owner's limits refuse it.
            DeviceError: the device is offline, not listening now, or went away.
        """
        started = time.monotonic()
        arguments: dict[str, Any] = {"message": message}
        if emotion is not None:
            arguments["emotion"] = emotion
        outcome, reason = "ok", None
        try:
            face = self._check(device, message, emotion)
            assert isinstance(message, str)  # _check made sure
            await self._send(device, alert_frame(message, face))
            return f"message shown on {device.alias}"
        except CallRejected as exc:
            outcome, reason = "rejected", str(exc)
            raise
        except DeviceError as exc:
            outcome, reason = type(exc).__name__, str(exc)
            raise
        except BaseException:
            outcome, reason = "cancelled", "cancelled by the caller"
            raise
        finally:
            self._audit.record(
                caller=caller, origin=origin, device_id=device.device_id, alias=device.alias,
                tool=TOOL, arguments=arguments, outcome=outcome, message=reason,
                started=started,
            )  # fmt: skip

    def _check(self, device: Device, message: object, emotion: object) -> str:
        """The face to show; raises what refuses the message (``notify``), cheapest first."""
        problem = text_problem(message)
        if problem is not None:
            raise CallRejected(f"{TOOL}: {problem}")
        face = DEFAULT_EMOTION if emotion is None else emotion
        if face not in EMOTIONS:
            raise CallRejected(f"{TOOL}: `emotion` must be one of {', '.join(EMOTIONS)}")
        alias, state = device.alias, device.record.state
        if state == REJECTED:
            raise CallRejected(f"device {alias} was rejected")
        if state == PENDING:
            raise CallRejected(f"device {alias} is waiting for approval "
                               f"(esp-mcp-gateway devices approve {alias})")  # fmt: skip
        options = self._config.device(device.device_id)
        if not options.messages:
            raise CallRejected(f"the owner turned messages to device {alias} off "
                               f'([devices."{device.device_id}"] messages = false)')  # fmt: skip
        now = self.clock()
        quiet = options.quiet
        if quiet is not None:
            local = time.localtime(now)
            if quiet.covers(local.tm_hour * 60 + local.tm_min):
                raise CallRejected(f"device {alias} is in its quiet hours ({quiet}, the "
                                   "gateway's local time); try again after them")  # fmt: skip
        if device.session is None:
            raise DeviceUnavailable(device.device_id, _absent(device))
        limit = options.messages_per_hour or self._config.messages_per_hour
        sent = self._recent(device.device_id, now)
        if len(sent) >= limit:
            wait = max(1, round((sent[0] + _HOUR - now) / 60))
            raise CallRejected(f"device {alias} had {len(sent)} messages in the last hour, "
                               f"its limit (messages_per_hour = {limit}); the next may go in "
                               f"{wait} min")  # fmt: skip
        return face

    def _recent(self, device_id: str, now: float) -> deque[float]:
        """When the messages of the last hour went to ``device_id``, oldest first."""
        sent = self._sent.get(device_id)
        if sent is None:
            return deque()
        while sent and sent[0] <= now - _HOUR:
            sent.popleft()
        if not sent:
            del self._sent[device_id]
        return sent

    async def _send(self, device: Device, frame: str) -> None:
        session = device.session
        send = session.send_frame if session is not None else None
        # A board serving MCP itself speaks no xiaozhi frames; a device another replica holds
        # (cluster) has no link here.
        if send is None or device.record.transport == BOARD_TRANSPORT:
            transport = device.record.transport or "its transport"
            raise CallRejected(f"device {device.alias} cannot show messages over {transport}")
        await send(frame)
        # Counted once it went: a refused or failed message takes nothing of the rate.
        self._sent.setdefault(device.device_id, deque()).append(self.clock())


def _absent(device: Device) -> str:
    """Why an offline device cannot take a message now."""
    last_seen = format_time(device.record.last_seen)
    if device.record.transport == "websocket":
        return (f"device {device.alias} is not listening now: over WebSocket a device takes "
                "messages only while its connection is open (a stock device: during a voice "
                f"conversation; last seen {last_seen})")  # fmt: skip
    return f"device {device.alias} is offline (last seen {last_seen})"
