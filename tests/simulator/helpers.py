"""A minimal gateway for the simulator's tests: a real websockets server on 127.0.0.1:0."""

from __future__ import annotations

import asyncio
import http
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from websockets.asyncio.server import Request, Response, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from tests.bounds import bound as scaled

PATH = "/xiaozhi/v1/"


def bound(seconds: float = 5.0) -> float:
    """A wait bound in seconds, scaled for this machine (tests/bounds.py)."""
    return scaled(seconds)


class MiniGateway:
    """Accepts devices, answers their hello, and records what they send.

    ``hello`` is the server hello sent in reply to the device hello (None: send none, the test
    does it). ``refuse`` makes the first ``refusals`` handshakes fail with that HTTP status.
    """

    def __init__(
        self, hello: dict[str, Any] | None, refuse: int | None, refusals: int = 1_000_000
    ) -> None:
        self.hello = hello
        self.refuse = refuse
        self.refusals = refusals
        self.url = ""
        self.requests: list[Request] = []
        self.raw: asyncio.Queue[str | bytes] = asyncio.Queue()
        self.connections: asyncio.Queue[ServerConnection] = asyncio.Queue()
        self.ended: asyncio.Queue[ConnectionClosed | None] = asyncio.Queue()
        self.ws: ServerConnection | None = None

    def process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        self.requests.append(request)
        if self.refuse is not None and self.refusals > 0:
            self.refusals -= 1
            return connection.respond(http.HTTPStatus(self.refuse), "no\n")
        return None

    async def handler(self, ws: ServerConnection) -> None:
        self.ws = ws
        await self.connections.put(ws)
        try:
            async for frame in ws:
                await self.raw.put(frame)
                if self.hello is not None and _is_hello(frame):
                    await ws.send(json.dumps(self.hello))
        except ConnectionClosed as exc:
            await self.ended.put(exc)
        else:
            await self.ended.put(None)

    async def recv(self) -> dict[str, Any]:
        """The next JSON message the device sent (binary frames are not expected)."""
        async with asyncio.timeout(bound()):
            frame = await self.raw.get()
        assert isinstance(frame, str)
        message: dict[str, Any] = json.loads(frame)
        return message

    async def recv_mcp(self) -> dict[str, Any]:
        """The payload of the next message, which must be an mcp envelope."""
        message = await self.recv()
        assert message["type"] == "mcp", message
        payload: dict[str, Any] = message["payload"]
        return payload

    async def send(self, message: dict[str, Any] | str | bytes) -> None:
        """Send a raw message (a dict is JSON-encoded) to the connected device."""
        assert self.ws is not None
        await self.ws.send(message if isinstance(message, str | bytes) else json.dumps(message))

    async def send_mcp(self, payload: dict[str, Any], session_id: str = "sess-1") -> None:
        """Send a JSON-RPC payload in an mcp envelope."""
        await self.send({"session_id": session_id, "type": "mcp", "payload": payload})

    async def request(self, request_id: int, method: str, **params: Any) -> dict[str, Any]:
        """Send a request and return the next mcp payload (the reply, in a quiet session)."""
        await self.send_mcp(
            {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        )
        return await self.recv_mcp()

    async def wait_ended(self) -> ConnectionClosed | None:
        """How the next connection ended: None for a clean close, else the exception."""
        async with asyncio.timeout(bound()):
            return await self.ended.get()

    async def next_connection(self) -> ServerConnection:
        """Wait for the next device connection."""
        async with asyncio.timeout(bound()):
            return await self.connections.get()


def _is_hello(frame: str | bytes) -> bool:
    return isinstance(frame, str) and json.loads(frame).get("type") == "hello"


SERVER_HELLO = {
    "type": "hello",
    "transport": "websocket",
    "session_id": "sess-1",
    "audio_params": {"format": "opus", "sample_rate": 24000, "channels": 1, "frame_duration": 60},
}


@asynccontextmanager
async def mini_gateway(
    hello: dict[str, Any] | None = SERVER_HELLO, refuse: int | None = None, refusals: int = 10**6
) -> AsyncIterator[MiniGateway]:
    """Run a :class:`MiniGateway` on a free loopback port."""
    gateway = MiniGateway(hello, refuse, refusals)
    async with serve(
        gateway.handler, "127.0.0.1", 0, process_request=gateway.process_request
    ) as server:
        port = server.sockets[0].getsockname()[1]
        gateway.url = f"ws://127.0.0.1:{port}{PATH}"
        yield gateway
