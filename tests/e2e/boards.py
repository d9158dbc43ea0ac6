"""Boards played by servers nobody here wrote: the MCP Python SDK's ``MCPServer``, the
TypeScript SDK's ``McpServer`` (``ts_board``), and hostile ones answering by hand (``Hostile``).

Each board has a tool that returns an image, a slow tool (it answers once the test releases
it), and a tool that adds a tool and tells its client the list changed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ImageContent
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from tests import programs
from tests.conftest import bound, missing_program, uses_program

# A 1x1 PNG: what a board's camera tool returns, as MCP image content.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGP4z8DwHwAFAAH/iZk9HQAAAABJRU5ErkJggg=="
)


@dataclass
class BoardState:
    """What the test sees of a board: how it was called, and the slow tool's release."""

    release: asyncio.Event = field(default_factory=asyncio.Event)
    slow_started: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    calls: list[str] = field(default_factory=list)


def python_board(name: str, state: BoardState) -> MCPServer:
    """An MCP Python SDK server with the tools every board test uses."""
    server = MCPServer(name)

    @server.tool(description="Greet someone by name.")
    def greet(who: str) -> str:
        state.calls.append("greet")
        return f"hello {who} from {name}"

    @server.tool(description="Take a photo.")
    def take_photo() -> ImageContent:
        state.calls.append("take_photo")
        data = base64.b64encode(PNG).decode()
        return ImageContent(type="image", data=data, mime_type="image/png")

    @server.tool(description="Answer once the test lets it.")
    async def slow() -> str:
        state.calls.append("slow")
        state.slow_started.set()
        try:
            await state.release.wait()
        except asyncio.CancelledError:
            state.cancelled.set()
            raise
        return "done"

    @server.tool(description="Add a tool named extra.")
    async def grow(ctx: Context) -> str:
        state.calls.append("grow")
        server.add_tool(lambda: "extra!", name="extra", description="Added at run time.")
        await ctx.session.send_tool_list_changed()  # handshake-era clients hear it here
        return "grown"

    return server


@asynccontextmanager
async def served(app: ASGIApp, sock: socket.socket | None = None) -> AsyncIterator[str]:
    """``app`` on uvicorn (its lifespan on: the SDK's session manager runs there) on a loopback
    socket bound before it starts; yields ``http://127.0.0.1:PORT``."""
    if sock is None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
    config = uvicorn.Config(app, lifespan="on", log_config=None, log_level="warning")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]), name="board")
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        server.force_exit = True
        await asyncio.wait_for(serving, bound(10))
        sock.close()  # ours, or the caller's duplicate of its listening socket


def bearer_only(app: ASGIApp, token: str) -> ASGIApp:
    """``app`` answering 401 to any request without ``Authorization: Bearer <token>``."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != expected:
            await PlainTextResponse("no", 401)(scope, receive, send)
            return
        await app(scope, receive, send)

    return guarded


@dataclass
class Hostile:
    """A board that answers JSON-RPC by hand, the way ``behaviour`` says, and counts requests.

    Behaviours: ``endless`` (a page of one tool, and one more page, forever), ``huge`` (pages
    of about 1 MB, forever), ``bad_schemas`` (good and broken tools), ``big_result`` (a 50 MB
    call result), ``silent`` (never answers ``initialize``), ``redirect`` (every POST is sent
    to ``location``).
    """

    behaviour: str
    location: str = ""
    pages: int = 0
    requests: int = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        self.requests += 1
        request = Request(scope, receive)
        if request.method != "POST":
            await PlainTextResponse("", 405)(scope, receive, send)
            return
        if self.behaviour == "redirect":
            await Response(status_code=307, headers={"Location": self.location})(
                scope, receive, send
            )
            return
        message = json.loads(await request.body())
        if "id" not in message:
            await Response(status_code=202)(scope, receive, send)
            return
        if message["method"] == "initialize" and self.behaviour == "silent":
            await asyncio.Event().wait()
        result = self._result(message)
        if isinstance(result, Response):
            await result(scope, receive, send)
            return
        reply = {"jsonrpc": "2.0", "id": message["id"], "result": result}
        await JSONResponse(reply)(scope, receive, send)

    def _result(self, message: dict[str, Any]) -> dict[str, Any] | Response:
        method = message["method"]
        if method == "initialize":
            info = {"name": f"hostile-{self.behaviour}", "version": "1"}
            return {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                    "serverInfo": info}  # fmt: skip
        if method == "tools/list":
            return self._page()
        if method == "tools/call" and self.behaviour == "big_result":
            return StreamingResponse(_fifty_megabytes(message["id"]), media_type="application/json")
        return {"content": [{"type": "text", "text": "ok"}]} if method == "tools/call" else {}

    def _page(self) -> dict[str, Any]:
        self.pages += 1
        schema = {"type": "object", "properties": {}}
        good = {"name": "fine", "description": "A good tool.", "inputSchema": schema}
        if self.behaviour == "bad_schemas":
            return {"tools": [
                {"name": "no_schema", "description": "Its schema is a string.",
                 "inputSchema": "nope"},
                {"name": "bad_props", "description": "Properties is a number.",
                 "inputSchema": {"type": "object", "properties": 5}},
                good,
            ]}  # fmt: skip
        if self.behaviour == "huge":
            tools = [{**good, "name": f"t{self.pages}_{i}", "description": "x" * 100}
                     for i in range(6000)]  # fmt: skip
            return {"tools": tools, "nextCursor": f"c{self.pages}"}
        if self.behaviour == "endless":
            return {"tools": [{**good, "name": f"t{self.pages}"}], "nextCursor": f"c{self.pages}"}
        return {"tools": [good]}


async def _fifty_megabytes(request_id: object) -> AsyncIterator[bytes]:
    head = {"jsonrpc": "2.0", "id": request_id, "result": {"content": [{"type": "text"}]}}
    yield json.dumps(head)[: -len("}]}}")].encode() + b', "text": "'
    chunk = b"x" * (1024 * 1024)
    for _ in range(50):
        yield chunk
    yield b'"}]}}'


@asynccontextmanager
async def ts_board(name: str) -> AsyncIterator[str]:
    """A board played by the MCP TypeScript SDK's server (tests/e2e/ts_board.cjs, node);
    yields its MCP URL. Skips when the SDK is not installed (tests/programs.py)."""
    sdk = "@modelcontextprotocol/sdk"
    uses_program(sdk)
    folder = programs.npm_package(sdk)
    if folder is None or shutil.which("node") is None:
        missing_program(sdk)
    modules = folder.parent.parent if sdk.startswith("@") else folder.parent
    script = Path(__file__).with_name("ts_board.cjs")
    env = {**os.environ, "NODE_PATH": str(modules)}
    process = await asyncio.create_subprocess_exec(
        "node", str(script), name, env=env, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        port = int(await asyncio.wait_for(process.stdout.readline(), bound(20)))
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.kill()
        await process.wait()


class Switchable:
    """``app``, or a board whose MCP server is down (503 to every request) while ``down``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.down = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.down:
            await PlainTextResponse("rebooting", 503)(scope, receive, send)
            return
        await self.app(scope, receive, send)
