"""A stock xiaozhi device that talks to its voice server, for the voice proxy's tests.

It does what xiaozhi-esp32 2.x does (docs/protocol.md §3, §8): checks in at its OTA URL with
its headers and system-info body, polls ``<ota>activate`` while the reply carries an
``activation``, and per conversation opens the WebSocket named by the reply with ``Authorization:
Bearer <token>``, ``Protocol-Version``, ``Device-Id`` and ``Client-Id``, says hello, waits for the
server's hello, streams audio frames, and answers MCP requests from whoever sends them (a
``RawDevice`` is its MCP brain). It records what it receives.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx2
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from tests.conftest import bound
from tests.e2e.helpers import STOCK_HELLO, RawDevice
from tests.upstream_server import first

JsonObject = dict[str, Any]

LAMP_TOOLS = [
    {"name": "self.lamp.turn_on", "description": "Turn the lamp on.",
     "inputSchema": {"type": "object", "properties": {}}},
    {"name": "self.audio_speaker.set_volume", "description": "Set the volume.",
     "inputSchema": {"type": "object", "properties": {"volume": {"type": "integer"}},
                     "required": ["volume"]}},
]  # fmt: skip


@dataclass
class Conversation:
    """One open conversation: the WebSocket, what came in, and the server's hello."""

    ws: ClientConnection
    hello: JsonObject
    audio: list[bytes] = field(default_factory=list)
    messages: list[JsonObject] = field(default_factory=list)  # non-MCP text, parsed
    texts: list[str] = field(default_factory=list)  # non-MCP text, as it arrived
    garbage: list[str] = field(default_factory=list)  # text frames that are not JSON
    mcp: list[JsonObject] = field(default_factory=list)  # MCP payloads received
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    _audio_event: asyncio.Event = field(default_factory=asyncio.Event)
    _text_event: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait_texts(self, count: int) -> list[str]:
        """The first ``count`` non-MCP text frames received, once they all arrived."""
        return await first(count, self.texts, self._text_event)

    async def wait_audio(self, count: int) -> list[bytes]:
        """The first ``count`` binary frames received, once they all arrived."""
        return await first(count, self.audio, self._audio_event)

    async def send_audio(self, frames: list[bytes]) -> None:
        """Send ``frames`` as binary frames, in order."""
        for frame in frames:
            await self.ws.send(frame)


@dataclass
class VoiceDevice:
    """A stock device (see the module docstring)."""

    device_id: str = "aa:bb:cc:dd:ee:10"
    client_id: str = "7c1f0e4a-0000-4000-8000-00000000aa10"
    board: RawDevice = field(default_factory=lambda: RawDevice("", "lamp", LAMP_TOOLS))
    settings: JsonObject = field(default_factory=dict)  # what its last OTA reply said

    def ota_headers(self) -> dict[str, str]:
        """The headers of its OTA requests (docs/protocol.md §3)."""
        return {
            "Activation-Version": "2",
            "Device-Id": self.device_id,
            "Client-Id": self.client_id,
            "Serial-Number": "SN-0042",
            "User-Agent": "bread-compact-wifi/2.4.2",
            "Accept-Language": "zh-CN",
            "Content-Type": "application/json",
        }

    def system_info(self) -> bytes:
        """Its OTA body: the board's system-info JSON (a part of it)."""
        info = {"mac_address": self.device_id, "uuid": self.client_id,
                "application": {"name": "xiaozhi", "version": "2.4.2"},
                "board": {"type": "bread-compact-wifi", "ssid": "home"}}  # fmt: skip
        return json.dumps(info).encode()

    async def check_in(self, ota_url: str) -> httpx2.Response:
        """POST its check-in; keep the reply's settings when it is a 200."""
        async with httpx2.AsyncClient(timeout=bound(20)) as http:
            response = await http.post(ota_url, headers=self.ota_headers(),
                                       content=self.system_info())  # fmt: skip
        if response.status_code == 200:
            self.settings = response.json()
        return response

    async def activate(self, ota_url: str, tries: int = 5) -> list[int]:
        """Poll ``<ota>activate`` until it answers 200 (as the firmware does); the statuses."""
        statuses: list[int] = []
        challenge = self.settings.get("activation", {}).get("challenge", "")
        body = json.dumps({"algorithm": "hmac-sha256", "serial_number": "SN-0042",
                           "challenge": challenge, "hmac": "00" * 32}).encode()  # fmt: skip
        async with httpx2.AsyncClient(timeout=bound(20)) as http:
            while len(statuses) < tries and 200 not in statuses:
                response = await http.post(ota_url + "activate", headers=self.ota_headers(),
                                           content=body)  # fmt: skip
                statuses.append(response.status_code)
        return statuses

    @asynccontextmanager
    async def conversation(self, hello: JsonObject | None = None) -> AsyncIterator[Conversation]:
        """Open a conversation where its settings say, ``hello`` (else the stock one) included;
        closed on exit. The first JSON message the device gets must be the server's hello."""
        websocket = self.settings["websocket"]
        headers = {"Authorization": f"Bearer {websocket['token']}",
                   "Protocol-Version": str(websocket.get("version", 1)),
                   "Device-Id": self.device_id, "Client-Id": self.client_id}  # fmt: skip
        async with connect(websocket["url"], additional_headers=headers,
                           open_timeout=bound(10), compression=None) as ws:  # fmt: skip
            await ws.send(json.dumps(hello or STOCK_HELLO))
            garbage = []
            async with asyncio.timeout(bound(10)):  # the firmware waits 10 s for the hello
                while True:
                    frame = await ws.recv()
                    try:
                        hello = json.loads(frame)
                        break
                    except ValueError:  # logged and dropped by the firmware
                        garbage.append(str(frame))
            assert hello["type"] == "hello", hello
            talk = Conversation(ws, hello, garbage=garbage)
            reader = asyncio.create_task(self._read(talk))
            try:
                yield talk
            finally:
                await ws.close()
                reader.cancel()  # it may be inside a tool that never answers
                with contextlib.suppress(asyncio.CancelledError):
                    await reader

    async def _read(self, talk: Conversation) -> None:
        try:
            async for frame in talk.ws:
                if isinstance(frame, bytes):
                    talk.audio.append(frame)
                    talk._audio_event.set()
                    continue
                try:
                    message = json.loads(frame, parse_constant=_no_constant)
                except ValueError:
                    talk.garbage.append(frame)
                    continue
                if message.get("type") == "mcp" and not isinstance(message.get("payload"), dict):
                    talk.garbage.append(frame)  # the firmware finds no payload to parse
                    continue
                if message.get("type") != "mcp":
                    talk.messages.append(message)
                    talk.texts.append(frame)
                    talk._text_event.set()
                    continue
                talk.mcp.append(message["payload"])
                reply = await self.board.respond(message)
                if reply is not None:
                    await talk.ws.send(json.dumps(reply))
        except ConnectionClosed:
            pass
        finally:
            talk.closed.set()


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON (cJSON rejects it)")
