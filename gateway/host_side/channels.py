"""Claude Code channels: chosen device events pushed into a running stdio session.

Claude Code (research preview, ≥ 2.1.80, behind ``--dangerously-load-development-channels``)
shows a ``notifications/claude/channel {content, meta}`` from a stdio server that declares
``capabilities.experimental["claude/channel"]`` to the model unprompted: the one host push path
there is (docs/events.md). The gateway declares it in stdio mode when a device opts in
(``[devices."<id>"] channel = ["button", ...]``, loggers, ``"*"`` for all), and sends a
device's opted-in events only to handshake-era stdio sessions whose client asked for channels:
it declared ``experimental["claude/channel"]`` itself, or it is Claude Code, which declares no
client capability for it (2.1.332, read from its binary) and registers its handler when the
server declares the capability. Claude Code drops what arrives before the handshake ends, so a
session is taken at ``notifications/initialized``. Per device at most ``BURST`` messages go out
in ``WINDOW`` seconds; the others stay in the device's events resource.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

import mcp.types as types
from mcp.server import ServerRequestContext
from mcp.server.session import ServerSession
from mcp.types.version import MODERN_PROTOCOL_VERSIONS

from gateway.compat.mcp_sdk import session_connection
from gateway.config import Config
from gateway.devices.events import DeviceEvent, EventStore
from gateway.devices.registry import DeviceView
from gateway.host_side.event_resources import may_see

__all__ = ["CHANNEL", "ChannelNotification", "Channels"]

Context = ServerRequestContext[Any, Any]

CHANNEL = "claude/channel"
CLAUDE_CODE = "claude-code"  # Claude Code's clientInfo.name
BURST, WINDOW = 3, 60.0  # messages per device per window (seconds)
_CONTENT_CHARS = 1000


class ChannelParams(types.NotificationParams):
    """What Claude Code reads: the text the model sees, and string attributes of it."""

    content: str
    meta: dict[str, str]


class ChannelNotification(
    types.Notification[ChannelParams, Literal["notifications/claude/channel"]]
):
    """``notifications/claude/channel`` (Claude Code's schema: ``content`` string, ``meta``
    string to string)."""

    method: Literal["notifications/claude/channel"] = "notifications/claude/channel"
    params: ChannelParams


def wants_channel(ctx: Context) -> bool:
    """Did the client of ``ctx`` ask for channel messages (see the module's docstring)?"""
    capabilities = ctx.session.client_capabilities
    experimental = capabilities.experimental if capabilities is not None else None
    if experimental and CHANNEL in experimental:
        return True
    params = ctx.session.client_params
    return params is not None and params.client_info.name == CLAUDE_CODE


class Channels:
    """The stdio sessions that take channel messages, and the messages they get."""

    def __init__(
        self,
        config: Config,
        registry: DeviceView,
        events: EventStore,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config
        self._registry = registry
        self._events = events
        self._clock = clock
        self._sessions: dict[int, ServerSession] = {}
        self._sent: dict[str, deque[float]] = {}  # device id -> when its last messages went

    def capabilities(self) -> dict[str, dict[str, Any]] | None:
        """The experimental capabilities a stdio server declares: the channel, if any device
        opts in."""
        if any(options.channel for options in self._config.devices.values()):
            return {CHANNEL: {}}
        return None

    def initialized(self, ctx: Context) -> None:
        """A handshake-era session ended its handshake: take it if it is stdio and asked."""
        if ctx.request is not None or ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return  # HTTP, SSE, or no unsolicited path (2026 era)
        if not wants_channel(ctx):
            return
        connection = session_connection(ctx.session)
        if connection is not None and id(connection) not in self._sessions:
            self._sessions[id(connection)] = ctx.session
            connection.exit_stack.callback(self._sessions.pop, id(connection), None)

    async def forward(self) -> None:
        """Send each opted-in event to the channel sessions (runs for the gateway's life)."""
        async with self._events.watch() as feed:
            async for event in feed:
                if self._sessions:
                    await self._send(event)

    async def _send(self, event: DeviceEvent) -> None:
        chosen = self._config.device(event.device_id).channel
        device = self._registry.get(event.device_id)
        if device is None or not (event.logger in chosen or "*" in chosen):
            return
        if not self._allowed(event.device_id):
            return
        data = json.dumps(event.data, ensure_ascii=False)
        text = f"{device.alias} {event.logger or 'event'} ({event.level}): {data}"
        meta = {
            "device": device.alias,
            "logger": event.logger,
            "level": event.level,
            "seq": str(event.seq),
        }
        message = ChannelNotification(
            params=ChannelParams(content=text[:_CONTENT_CHARS], meta=meta)
        )
        for session in list(self._sessions.values()):
            if may_see(None, device):  # stdio: the owner's own host
                with contextlib.suppress(Exception):  # a session gone is skipped, never fatal
                    await session.send_notification(message)  # type: ignore[arg-type]

    def _allowed(self, device_id: str) -> bool:
        now = self._clock()
        sent = self._sent.setdefault(device_id, deque(maxlen=BURST))
        if len(sent) == BURST and now - sent[0] < WINDOW:
            return False
        sent.append(now)
        return True
