"""A request POSTed to ``/mcp`` that streams nothing before its result, answered as JSON.

The SDK answers every request POSTed to ``/mcp`` with an SSE stream (its JSON mode would drop
what a call streams before its result: progress, a device's log lines, a question to the host).
The stream's headers go out at once, the result later as one event, the stream's end after it:
three writes, three wake-ups of the host. Worse, a host cannot keep the connection: the SDK's
client (httpx) stops reading at the result and closes a response not read to its end, so each
of its calls opens a new TCP connection, on both sides.

Most calls stream nothing before their result. ``JsonAnswers`` holds a POST's stream headers
until its first message. When that is the request's result, which ends the stream (the SDK's
writer stops at it; MCP streamable HTTP: "the server SHOULD close the SSE stream" once the
response is sent), the request is answered with it as ``application/json``, which the spec lets
a server choose and every client must take: the body the event carried, with a Content-Length,
the stream's other headers kept (the session id). Anything else first (a notification, a
request to the host, a keep-alive ping, the stream's end, an event with an id) and the stream
goes out as it always did, its headers first, then everything as it comes.

A JSON-RPC error keeps the stream: the errors a session's end gives the calls still open (a
host leaving mid-call, its DELETE) come as its session closes, and the SDK's client (mcp 2.3)
drops a late streamed answer where it raises on a late JSON one.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["JsonAnswers", "lone_result"]

# One SSE event as sse-starlette writes the SDK's messages (``{"event": "message", "data": …}``,
# its CRLF separator): no id (a resumable event), one data line.
_EVENT = b"event: message\r\ndata: "
_END = b"\r\n\r\n"
# A JSON-RPC result as the SDK serializes one (pydantic, its fields in order): a notification
# or a request to the host has a method instead, an error its error; they keep the stream.
_RESULT = re.compile(rb'\{"jsonrpc":"2\.0","id":(?:-?\d+|"(?:[^"\\]|\\.)*"),"result":')
_STREAM = b"text/event-stream"

# Where a POST's response stands.
_WAITING = 0  # nothing sent yet
_HOLDING = 1  # the stream's start held, for its first message
_PASSING = 2  # a stream (or any other answer) after all: everything passes as it comes
_ANSWERED = 3  # answered as JSON: the stream's end, and anything after it, are not sent


def lone_result(chunk: object) -> bytes | None:
    """The JSON-RPC result ``chunk``, one SSE body chunk, carries as its only event; else None
    (a notification, a request, an error, a ping, an event with an id or several lines)."""
    if not isinstance(chunk, bytes) or not chunk.startswith(_EVENT) or not chunk.endswith(_END):
        return None
    data = chunk[len(_EVENT) : -len(_END)]
    if b"\n" in data or b"\r" in data or _RESULT.match(data) is None:
        return None
    return data


class JsonAnswers:
    """ASGI middleware: a POST's SSE stream whose first message is its result goes as JSON."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        """The app serving the request, a POST's answer through ``_Answer``.

        Not a coroutine: the request's task resumes through every frame between uvicorn and
        the SDK's app each time it wakes, and this layer needs none of its own.
        """
        if scope["type"] != "http" or scope["method"] != "POST":
            return self.app(scope, receive, send)
        return self.app(scope, receive, _Answer(send).send)


class _Answer:
    """One POST's ``send``: holds a stream's start until its first message."""

    __slots__ = ("_held", "_send", "_state")

    def __init__(self, send: Send) -> None:
        self._send = send
        self._state = _WAITING
        self._held: Message | None = None

    async def send(self, message: Message) -> None:
        """Pass ``message`` on, hold it, or answer the request with it as JSON."""
        state = self._state
        if state == _PASSING:
            await self._send(message)
        elif state == _WAITING:
            if message["type"] == "http.response.start" and _streams(message):
                self._held, self._state = message, _HOLDING
                return
            self._state = _PASSING
            await self._send(message)
        elif state == _HOLDING:
            held, self._held = self._held, None
            assert held is not None
            body = message.get("body") if message.get("more_body") else None
            answer = lone_result(body) if message["type"] == "http.response.body" else None
            if answer is None:
                self._state = _PASSING
                await self._send(held)
                await self._send(message)
                return
            self._state = _ANSWERED
            headers = [(b"content-length", b"%d" % len(answer)),
                       (b"content-type", b"application/json")]  # fmt: skip
            headers += [(k, v) for k, v in held.get("headers", ()) if k.lower() != b"content-type"]
            await self._send({"type": "http.response.start", "status": 200, "headers": headers})
            await self._send({"type": "http.response.body", "body": answer, "more_body": False})


def _streams(start: Message) -> bool:
    """Is ``start`` a 200 that opens an SSE stream?"""
    if start.get("status") != 200:
        return False
    for name, value in start.get("headers", ()):
        if name.lower() == b"content-type":
            return bool(value.startswith(_STREAM))
    return False
