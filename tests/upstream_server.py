"""A voice server for proxy tests that behaves like xiaozhi-esp32-server (docs/protocol.md §8).

``UpstreamServer`` is a Starlette app on a real uvicorn (port 0):

- ``POST /xiaozhi/ota/`` needs ``Device-Id`` and ``Client-Id``; it answers ``server_time``,
  ``firmware``, ``websocket{url, token}`` (or, with ``offer="mqtt"``/``"both"``, an ``mqtt``
  section too), and ``activation{code, challenge}`` until the device is activated;
- ``POST /xiaozhi/ota/activate`` answers 202 ``activation_polls`` times, then 200;
- ``/xiaozhi/v1/`` accepts a WebSocket only with a token made for its Device-Id and Client-Id
  (base64url HMAC of ``client_id|device_id|timestamp``, then ``.timestamp``); after the device's
  hello it answers its own hello, sends ``initialize`` (id 1, with its vision URL and token) and
  ``tools/list`` (id 2, every page), and records the binary frames it receives;
  ``UpstreamSession.call()`` calls a tool with its counter (1, 2, ...) and ``int(id)``s replies;
- ``POST /vision/explain`` records uploads made with its own vision token.

Faults for the failure tests: ``ota_fault`` (``"garbage"``, ``"oversize"``, ``"500"``,
``"hang"``), ``session_fault`` (``"close_after_hello"``, ``"garbage"``) and ``stalled`` (device
ids whose sessions stop reading after their first audio frame, until ``unstall`` is set).
The MQTT side (an MQTT login, a UDP hello) is added beside this by the MQTT proxy's tests.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from tests.conftest import bound

JsonObject = dict[str, Any]
T = TypeVar("T")
ACTIVATION_CODE = "246810"
VISION_TOKEN = "upstream-vision-token"
VISION_ANSWER = "the upstream sees a cat"


async def first(count: int, frames: list[T], arrived: asyncio.Event) -> list[T]:
    """The first ``count`` of ``frames``, once there are that many (``arrived`` is set at each)."""
    async with asyncio.timeout(bound(10)):
        while len(frames) < count:
            arrived.clear()
            await arrived.wait()
    return frames[:count]


def make_token(secret: bytes, client_id: str, device_id: str, timestamp: int) -> str:
    """A device token as xiaozhi-esp32-server's ``core/auth.py`` makes it."""
    message = f"{client_id}|{device_id}|{timestamp}".encode()
    signature = hmac.new(secret, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(signature).decode().rstrip("=") + f".{timestamp}"


@dataclass
class UpstreamSession:
    """One device conversation on the upstream's WebSocket."""

    websocket: WebSocket
    device_id: str
    client_id: str
    protocol_version: str | None
    hello: JsonObject | None = None
    audio: list[bytes] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    tools: list[JsonObject] = field(default_factory=list)
    initialize_reply: JsonObject | None = None
    listed: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    requested: asyncio.Event = field(default_factory=asyncio.Event)  # a request went out
    unexpected: list[JsonObject] = field(default_factory=list)  # replies to ids never sent
    _counter: int = 0
    _pending: dict[int, asyncio.Future[JsonObject]] = field(default_factory=dict)
    _audio_event: asyncio.Event = field(default_factory=asyncio.Event)

    async def call(self, name: str, arguments: JsonObject | None = None) -> JsonObject:
        """Call a device tool the way the server does; return the reply payload."""
        self._counter += 1
        params = {"name": name, "arguments": arguments or {}}
        return await self.request(self._counter, "tools/call", params)

    async def request(self, request_id: int, method: str, params: JsonObject) -> JsonObject:
        """Send one MCP request with ``request_id``; wait for its reply."""
        future: asyncio.Future[JsonObject] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        payload = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        await self.send_json({"type": "mcp", "payload": payload})
        self.requested.set()
        return await asyncio.wait_for(future, bound(10))

    async def send_json(self, message: JsonObject) -> None:
        """Send one text frame to the device."""
        await self.websocket.send_text(json.dumps({"session_id": "upstream-session", **message}))

    async def wait_audio(self, count: int) -> list[bytes]:
        """The first ``count`` binary frames, once they all arrived."""
        return await first(count, self.audio, self._audio_event)

    def _on_reply(self, payload: JsonObject) -> None:
        future = self._pending.pop(int(payload["id"]), None)  # int(): as the server parses it
        if future is None:
            self.unexpected.append(payload)
        elif not future.done():
            future.set_result(payload)

    def _fail_pending(self) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ConnectionError("the device went away"))


class UpstreamServer:
    """The voice server (see the module docstring); ``async with server.running():``."""

    def __init__(self, *, offer: str = "websocket", activation_polls: int = 1) -> None:
        self.offer = offer
        self.activation_polls = activation_polls
        self.secret = b"upstream-secret"
        self.activated: set[str] = set()
        self.polls: dict[str, int] = {}
        self.ota_requests: list[tuple[dict[str, str], bytes]] = []
        self.activations: list[tuple[dict[str, str], bytes]] = []
        self.sessions: list[UpstreamSession] = []
        self.uploads: list[tuple[dict[str, str], bytes]] = []
        self.refused: list[str] = []
        self.ota_fault: str | None = None
        self.session_fault: str | None = None
        self.base_url = ""
        self.vision_url: str | None = None  # where its initialize says to upload; its own if None
        self.websocket_version: int | None = None  # websocket.version of its OTA reply, if any
        self.websocket_extra: JsonObject = {}  # more keys for its OTA reply's websocket section
        self.hello_delay = 0.0  # seconds it takes to answer a hello (a slow server)
        self.stalled: set[str] = set()  # devices whose sessions stop reading after one frame
        self.unstall = asyncio.Event()
        self.new_session = asyncio.Event()
        self.mqtt_endpoint = "127.0.0.1:1883"  # its MQTT broker (tests/upstream_mqtt.py)
        self._stopping = asyncio.Event()

    @property
    def ota_url(self) -> str:
        """The OTA URL a stock device of this server has."""
        return f"{self.base_url}/xiaozhi/ota/"

    async def session(self, index: int = 0, device_id: str | None = None) -> UpstreamSession:
        """The ``index``-th WebSocket session (of ``device_id``, if given), once it exists."""
        async with asyncio.timeout(bound(10)):
            while len(mine := [s for s in self.sessions
                               if device_id in (None, s.device_id)]) <= index:  # fmt: skip
                self.new_session.clear()
                await self.new_session.wait()
        return mine[index]

    @asynccontextmanager
    async def running(self) -> AsyncIterator[UpstreamServer]:
        """Serve on a free loopback port until the block ends."""
        routes = [
            Route("/xiaozhi/ota/", self._ota, methods=["GET", "POST"]),
            Route("/xiaozhi/ota/activate", self._activate, methods=["POST"]),
            Route("/vision/explain", self._vision, methods=["POST"]),
            WebSocketRoute("/xiaozhi/v1/", self._websocket),
        ]
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        self.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(Starlette(routes=routes), lifespan="off", log_config=None,
                                log_level="warning", ws="websockets-sansio")  # fmt: skip
        server = uvicorn.Server(config)
        serving = asyncio.create_task(server.serve(sockets=[sock]), name="test.upstream")
        try:
            yield self
        finally:
            self._stopping.set()
            self.unstall.set()
            server.should_exit = True
            await asyncio.wait_for(serving, bound(10))
            sock.close()

    # --- OTA ---------------------------------------------------------------------------------

    async def _ota(self, request: Request) -> Response:
        headers = {k.lower(): v for k, v in request.headers.items()}
        body = await request.body()
        self.ota_requests.append((headers, body))
        if self.ota_fault == "hang":
            await self._stopping.wait()  # answers only as the server stops
        if self.ota_fault == "garbage":
            return PlainTextResponse("<html>bad gateway</html>")
        if self.ota_fault == "oversize":
            return JSONResponse({"padding": "x" * 100_000})
        if self.ota_fault == "500":
            return PlainTextResponse("internal error", status_code=500)
        device_id, client_id = headers.get("device-id"), headers.get("client-id")
        if not device_id or not client_id:
            return JSONResponse({"error": "missing device-id or client-id"}, status_code=400)
        now = int(time.time())
        reply: JsonObject = {
            "server_time": {"timestamp": now * 1000, "timezone_offset": 480},
            "firmware": {"version": "1.0.0", "url": ""},
        }
        if self.offer in ("websocket", "both"):
            reply["websocket"] = {
                "url": self.base_url.replace("http", "ws", 1) + "/xiaozhi/v1/",
                "token": make_token(self.secret, client_id, device_id, now),
            }
            if self.websocket_version is not None:
                reply["websocket"]["version"] = self.websocket_version
            reply["websocket"].update(self.websocket_extra)
        if self.offer in ("mqtt", "both"):
            mac = device_id.replace(":", "_")
            reply["mqtt"] = {
                "endpoint": self.mqtt_endpoint,
                "client_id": f"GID_test@@@{mac}@@@{client_id}",
                "username": base64.b64encode(b'{"ip":"1.2.3.4"}').decode(),
                "password": "upstream-mqtt-password",
                "publish_topic": "device-server",
                "subscribe_topic": f"devices/p2p/{mac}",
            }
        if device_id not in self.activated:
            reply["activation"] = {"code": ACTIVATION_CODE, "message": "xiaozhi.me\n246810",
                                   "challenge": "c4a1e5", "timeout_ms": 30000}  # fmt: skip
        return JSONResponse(reply)

    async def _activate(self, request: Request) -> Response:
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.activations.append((headers, await request.body()))
        device_id = headers.get("device-id", "")
        self.polls[device_id] = self.polls.get(device_id, 0) + 1
        if self.polls[device_id] <= self.activation_polls:
            return PlainTextResponse("Activation pending", status_code=202)
        self.activated.add(device_id)
        return PlainTextResponse("Device activated", status_code=200)

    async def _vision(self, request: Request) -> Response:
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.uploads.append((headers, await request.body()))
        if headers.get("authorization") != f"Bearer {VISION_TOKEN}":
            return JSONResponse({"success": False, "message": "bad token"}, status_code=401)
        return JSONResponse({"success": True, "result": VISION_ANSWER})

    # --- WebSocket ---------------------------------------------------------------------------

    def _admits(self, headers: dict[str, str]) -> bool:
        token = headers.get("authorization", "").removeprefix("Bearer ")
        device_id, client_id = headers.get("device-id", ""), headers.get("client-id", "")
        _, _, timestamp = token.rpartition(".")
        if not timestamp.isdigit():
            return False
        expected = make_token(self.secret, client_id, device_id, int(timestamp))
        return hmac.compare_digest(expected, token)

    async def _websocket(self, websocket: WebSocket) -> None:
        headers = {k.lower(): v for k, v in websocket.headers.items()}
        if not self._admits(headers):
            self.refused.append(headers.get("device-id", "?"))
            await websocket.close(code=1008)
            return
        await websocket.accept()
        session = UpstreamSession(websocket, headers["device-id"], headers["client-id"],
                                  headers.get("protocol-version"))  # fmt: skip
        self.sessions.append(session)
        self.new_session.set()
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                if message.get("bytes") is not None:
                    session.audio.append(message["bytes"])
                    session._audio_event.set()
                    if session.device_id in self.stalled:  # reads nothing more until told
                        await self.unstall.wait()
                elif message.get("text") is not None:
                    await self._on_text(session, message["text"])
        except WebSocketDisconnect:
            pass
        finally:
            session._fail_pending()
            session.closed.set()

    async def _on_text(self, session: UpstreamSession, text: str) -> None:
        session.texts.append(text)
        message = json.loads(text)
        if message.get("type") == "hello":
            session.hello = message
            if self.session_fault == "close_after_hello":
                await session.websocket.close(code=1011)
                return
            if self.session_fault == "garbage":
                await session.websocket.send_text('this is not JSON {"hello"')
            await asyncio.sleep(self.hello_delay)  # a slow server, thinking
            await session.send_json({"type": "hello", "transport": "websocket", "audio_params":
                                     {"format": "opus", "sample_rate": 24000, "channels": 1,
                                      "frame_duration": 60}})  # fmt: skip
            asyncio.get_running_loop().create_task(self._discover(session))
        elif message.get("type") == "mcp":
            payload = message.get("payload")
            if isinstance(payload, dict) and "id" in payload and "method" not in payload:
                session._on_reply(payload)

    async def _discover(self, session: UpstreamSession) -> None:
        vision = {"url": self.vision_url or f"{self.base_url}/vision/explain",
                  "token": VISION_TOKEN}  # fmt: skip
        params = {"protocolVersion": "2024-11-05", "capabilities": {"vision": vision},
                  "clientInfo": {"name": "xiaozhi-esp32-server", "version": "0.8"}}  # fmt: skip
        try:
            session.initialize_reply = await session.request(1, "initialize", params)
            cursor: str | None = ""
            while cursor is not None:
                page = await session.request(2, "tools/list", {"cursor": cursor})
                result = page.get("result") or {}
                session.tools.extend(result.get("tools", []))
                cursor = result.get("nextCursor") or None
            session.listed.set()
        except (ConnectionError, TimeoutError, RuntimeError, WebSocketDisconnect):
            pass
