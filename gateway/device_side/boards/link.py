"""``BoardLink``: a board's MCP session, as the text messages a ``DeviceConnection`` reads.

The SDK's client transport (streamable HTTP or SSE) carries JSON-RPC messages; a
``DeviceConnection`` and its ``DeviceProtocol`` speak xiaozhi envelopes. The link wraps what the
board sends in an envelope of this session and unwraps what the protocol sends, so everything
above the transport (discovery with its paging guards, catalogue checks, call limits and
timeouts, offline memory, audit) is the same for a board as for any device.

What the xiaozhi protocol leaves out and standard MCP needs is done here: the
``notifications/initialized`` after a successful ``initialize``, and a ``ping`` every
``ping_interval`` that notices a board gone silent (nothing else would, between calls). A reply
larger than ``max_bytes`` becomes an error reply to its request, so the caller hears why at
once rather than at its timeout.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
from mcp.shared.message import SessionMessage
from mcp.types import jsonrpc_message_adapter
from pydantic import ValidationError

from gateway.devices.link import LinkClosed

__all__ = ["BoardLink"]

logger = logging.getLogger(__name__)

_PING_PREFIX = "gateway-ping-"  # string ids: the protocol's own requests have int ids
TOO_LARGE = -32001
# A whole tool list, all pages together: a xiaozhi device's pages are 64 KB at most, a board's
# may be as large as any reply (a photo), so its list is bounded as a whole.
MAX_CATALOGUE_CHARS = 2 * 1024 * 1024


class BoardLink:
    """A ``DeviceLink`` over the SDK client transport's streams to one board."""

    sends_whole = False  # the SDK's write stream hands messages to a task: the sender sends
    pushes = False
    fail = None

    def __init__(
        self, read: Any, write: Any, session_id: str, *, max_bytes: int, label: str
    ) -> None:
        self._read = read
        self._write = write
        self._session_id = session_id
        self._max_bytes = max_bytes
        self._label = label
        self._scope: anyio.CancelScope | None = None
        self._init_id: object = None
        self._pings = 0
        self._unanswered: str | None = None
        self._listing: set[object] = set()  # ids of the current listing's tools/list requests
        self._listed = 0  # characters of the current listing so far
        self.closed = False
        self.initialized = False  # the board answered initialize: it speaks this transport
        self.failure: str | None = None  # why the link ended, if the board's side ended it

    async def send(self, text: str) -> None:
        """Send the JSON-RPC payload of one envelope the protocol made."""
        if self.closed:
            raise LinkClosed(f"board {self._label} is gone")
        payload = json.loads(text).get("payload")
        if isinstance(payload, dict) and payload.get("method") == "initialize":
            self._init_id = payload.get("id")
        if isinstance(payload, dict) and payload.get("method") == "tools/list":
            params = payload.get("params")
            if not (isinstance(params, dict) and params.get("cursor")):  # a new listing
                self._listing.clear()
                self._listed = 0
            self._listing.add(payload.get("id"))
        await self._send(payload)

    async def _send(self, payload: object) -> None:
        try:
            message = jsonrpc_message_adapter.validate_python(payload)
        except ValidationError as exc:  # ours, so a bug: the board must not get it
            logger.warning("board %s: not sent, not JSON-RPC: %s", self._label, exc)
            return
        try:
            await self._write.send(SessionMessage(message))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
            self._end("the board's transport closed")
            raise LinkClosed(f"board {self._label} is gone") from None

    async def ping(self) -> bool:
        """Ping the board; False when the last ping is still unanswered (the board is silent)."""
        if self.closed:
            return False
        if self._unanswered is not None:
            self._end("the board did not answer a ping")
            await self.aclose()
            return False
        self._pings += 1
        self._unanswered = f"{_PING_PREFIX}{self._pings}"
        try:
            await self._send({"jsonrpc": "2.0", "id": self._unanswered, "method": "ping"})
        except LinkClosed:
            return False
        return True

    async def __aiter__(self) -> AsyncIterator[str]:
        """Yield each message the board sends, wrapped in an envelope, until the link ends."""
        while not self.closed:
            with anyio.CancelScope() as self._scope:
                try:
                    item = await self._read.receive()
                except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                    self._end("the board's transport closed")
                    return
            if self._scope.cancelled_caught or self.closed:
                return
            if isinstance(item, Exception):
                self._end(f"transport error: {item}")
                logger.info("board %s: %s", self._label, self.failure)
                return
            text = await self._take(item)
            if text is not None:
                yield text
                del text

    async def _take(self, item: SessionMessage) -> str | None:
        payload = item.message.model_dump(by_alias=True, mode="json", exclude_unset=True)
        message_id = payload.get("id")
        if isinstance(message_id, str) and message_id.startswith(_PING_PREFIX):
            if message_id == self._unanswered:
                self._unanswered = None
            if "error" in payload:  # MCP: a ping is answered with {}; the SDK's stand-in for a
                self._end(f"ping failed: {payload['error']}")  # lost connection is an error
                await self.aclose()
            return None
        if message_id is not None and message_id == self._init_id and "method" not in payload:
            self._init_id = None
            if "result" not in payload:
                self._end(f"initialize failed: {payload.get('error')}")
                await self.aclose()
                return None
            self.initialized = True
            # MCP: the client confirms before anything else; the xiaozhi protocol has no such step.
            await self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        text = json.dumps({"session_id": self._session_id, "type": "mcp", "payload": payload})
        if message_id is None or "method" in payload:
            return text
        why = None
        if len(text) > self._max_bytes:
            why = (f"the board's reply has {len(text)} characters, more than "
                   f"{self._max_bytes} ([mcp_boards] max_message_bytes)")  # fmt: skip
        elif message_id in self._listing:
            self._listed += len(text)
            if self._listed > MAX_CATALOGUE_CHARS:
                why = f"the board's tool list is larger than {MAX_CATALOGUE_CHARS} characters"
        if why is None:
            return text
        reply = {"jsonrpc": "2.0", "id": message_id, "error": {"code": TOO_LARGE, "message": why}}
        return json.dumps({"session_id": self._session_id, "type": "mcp", "payload": reply})

    def _end(self, why: str) -> None:
        if self.failure is None and not self.closed:
            self.failure = why

    async def aclose(self) -> None:
        """End the link (idempotent); the transport is closed by whoever opened it."""
        self.closed = True
        if self._scope is not None:
            self._scope.cancel()
