"""Tests for gateway.host_side.json_answers: which POSTs are answered as JSON, and how."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from sse_starlette import EventSourceResponse
from starlette.types import Message, Receive, Scope, Send

from gateway.host_side.json_answers import JsonAnswers, lone_result

pytestmark = pytest.mark.anyio

RESULT = b'{"jsonrpc":"2.0","id":7,"result":{"content":[],"isError":false}}'
PROGRESS = b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":1}}'
ASK = b'{"jsonrpc":"2.0","id":0,"method":"elicitation/create","params":{}}'
ERROR = b'{"jsonrpc":"2.0","id":7,"error":{"code":-32800,"message":"Request cancelled"}}'
SESSION = (b"mcp-session-id", b"abc123")


def event(data: bytes) -> bytes:
    """One SSE event as sse-starlette writes the SDK's messages."""
    return b"event: message\r\ndata: " + data + b"\r\n\r\n"


def test_a_lone_result_event_gives_its_data() -> None:
    """The data of one result event is the JSON answer; anything else is no lone result."""
    assert lone_result(event(RESULT)) == RESULT
    assert lone_result(event(b'{"jsonrpc":"2.0","id":"a\\"b","result":{}}')) is not None
    for other in (PROGRESS, ASK, ERROR):
        assert lone_result(event(other)) is None
    assert lone_result(b"id: 1\r\n" + event(RESULT)) is None  # resumable: keeps the stream
    assert lone_result(event(RESULT) + event(RESULT)) is None  # two events
    assert lone_result(b": ping - 2026-12-02\r\n\r\n") is None
    assert lone_result(event(RESULT)[:-2]) is None  # not a whole event
    assert lone_result(memoryview(event(RESULT))) is None


class Streams:
    """The SDK's answer to a POSTed request: an SSE stream (sse-starlette) of ``events``."""

    def __init__(self, *events: bytes, status: int = 200) -> None:
        self.events, self.status = events, status

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def content() -> Any:
            for data in self.events:
                yield {"event": "message", "data": data.decode()}

        headers = {"Cache-Control": "no-cache, no-transform", "mcp-session-id": "abc123"}
        await EventSourceResponse(content(), status_code=self.status, headers=headers)(
            scope, receive, send
        )


async def _sent(app: Any, method: str = "POST") -> list[Message]:
    """The messages ``JsonAnswers(app)`` sends for one request."""
    sent: list[Message] = []
    done = False

    async def receive() -> Message:
        nonlocal done
        if not done:
            done = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await pending.wait()  # as a server does until the client leaves
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            pending.set()

    pending = anyio.Event()
    scope = {"type": "http", "method": method, "path": "/mcp", "headers": []}
    await JsonAnswers(app)(scope, receive, send)
    return sent


def _headers(start: Message) -> dict[bytes, bytes]:
    return dict(start["headers"])


async def test_a_stream_whose_first_message_is_its_result_is_answered_as_json() -> None:
    """Its result is the whole body, with its length and the stream's session header; the
    stream's end is not sent after it."""
    start, body = await _sent(Streams(RESULT))
    assert start["type"] == "http.response.start" and start["status"] == 200
    headers = _headers(start)
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"content-length"] == str(len(RESULT)).encode()
    assert headers[SESSION[0]] == SESSION[1]
    assert body == {"type": "http.response.body", "body": RESULT, "more_body": False}


@pytest.mark.parametrize("first", [PROGRESS, ASK, ERROR], ids=["progress", "request", "error"])
async def test_a_stream_that_starts_with_anything_else_goes_as_it_came(first: bytes) -> None:
    """Progress, a request to the host or an error first: the stream as the SDK wrote it."""
    start, *bodies = await _sent(Streams(first, RESULT))
    assert _headers(start)[b"content-type"].startswith(b"text/event-stream")
    assert [m["body"] for m in bodies] == [event(first), event(RESULT), b""]
    assert bodies[-1]["more_body"] is False


async def test_a_stream_that_ends_empty_goes_as_it_came() -> None:
    """No message at all: the stream's headers, then its end."""
    start, end = await _sent(Streams())
    assert _headers(start)[b"content-type"].startswith(b"text/event-stream")
    assert end["body"] == b"" and end["more_body"] is False


async def test_a_get_stream_and_other_answers_are_left_alone() -> None:
    """A GET's stream is a host's listening stream: never answered as JSON; nor is a stream
    that is not a 200, nor an answer that is not a stream."""
    start, *_ = await _sent(Streams(RESULT), method="GET")
    assert _headers(start)[b"content-type"].startswith(b"text/event-stream")
    start, *_ = await _sent(Streams(RESULT, status=201))
    assert _headers(start)[b"content-type"].startswith(b"text/event-stream")

    async def accepted(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 202, "headers": [SESSION]})
        await send({"type": "http.response.body", "body": b""})

    assert await _sent(accepted) == [
        {"type": "http.response.start", "status": 202, "headers": [SESSION]},
        {"type": "http.response.body", "body": b""},
    ]
