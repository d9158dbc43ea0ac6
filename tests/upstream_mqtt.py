"""The MQTT side of a test voice server, as xiaozhi-esp32-server behind its MQTT gateway behaves.

A real mosquitto is the upstream broker; ``UpstreamMqttServer`` is the server's client on it.
It reads what devices publish to ``device-server`` and answers on ``devices/p2p/<mac_>``
(docs/protocol.md, /work/shared/reference/voice-servers.md): a ``hello`` (transport ``udp``)
gets a hello reply with a ``udp`` block (server, port, key, nonce, hex) naming a real UDP socket
of the server, then the server sends ``initialize`` (id 1, ``capabilities.vision``) and, after
its reply, ``tools/list`` (id 2 for every page, ``cursor``); ``call()`` sends ``tools/call``
with its counter from 1 and matches the reply with ``int(id)``, as the real server does.

``mqtt_section()`` is what its OTA would answer for a device: ``endpoint`` on the non-TLS port,
the per-device login, ``publish_topic`` ``device-server``, ``subscribe_topic``
``devices/p2p/<mac_>``. One server serves one device (on a plain broker every device publishes
to ``device-server`` and a message does not say whose it is).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
from types import TracebackType
from typing import Any

import aiomqtt

from gateway.device_side.broker.aiomqtt_fixes import honour_cancellation
from tests.conftest import bound
from tests.mqtt_helpers import Mosquitto

JsonObject = dict[str, Any]

PUBLISH_TOPIC = "device-server"
SERVER_LOGIN = ("xiaozhi-server", "server-secret")


def device_login(mac: str) -> tuple[str, str]:
    """The upstream user name and password of a device, as tests/upstream_server.py's OTA
    issues them (the same for every device there)."""
    return base64.b64encode(b'{"ip":"1.2.3.4"}').decode(), "upstream-mqtt-password"


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, received: asyncio.Queue[bytes]) -> None:
        self.received = received

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        self.received.put_nowait(data)


class UpstreamMqttServer:
    """The voice server's MQTT client for one device; ``async with`` runs it."""

    def __init__(
        self, broker: Mosquitto, mac: str, *, vision_url: str = "http://up/vision"
    ) -> None:
        self.broker = broker
        self.mac = mac
        self.p2p = f"devices/p2p/{mac.replace(':', '_')}"
        self.vision = {"url": vision_url, "token": "upstream-vision-token"}
        self.received: list[bytes] = []  # every raw message the device sent
        self.hello_replies: list[bytes] = []  # every raw hello reply sent
        self.tools: asyncio.Queue[list[JsonObject]] = asyncio.Queue()  # each finished listing
        self.udp: asyncio.Queue[bytes] = asyncio.Queue()  # audio packets that reached the server
        self.udp_port = 0
        self._counter = 0
        self._replies: dict[int, asyncio.Future[JsonObject]] = {}
        self._listing: list[JsonObject] = []
        self._client: aiomqtt.Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._transport: asyncio.DatagramTransport | None = None
        self.ready = asyncio.Event()
        self.goodbye = asyncio.Event()  # set when a device says goodbye
        self.goodbyes: list[JsonObject] = []  # every goodbye received, parsed

    def mqtt_section(self, client_id: str) -> JsonObject:
        """The ``mqtt`` section of the upstream's OTA reply for the device."""
        username, password = device_login(self.mac)
        mac = self.mac.replace(":", "_")
        return {
            "endpoint": f"127.0.0.1:{self.broker.port}",
            "client_id": f"GID_test@@@{mac}@@@{client_id}",
            "username": username,
            "password": password,
            "publish_topic": PUBLISH_TOPIC,
            "subscribe_topic": self.p2p,
        }

    async def __aenter__(self) -> UpstreamMqttServer:
        loop = asyncio.get_running_loop()
        self._transport, _ = await loop.create_datagram_endpoint(
            lambda: _Udp(self.udp), local_addr=("127.0.0.1", 0)
        )
        self.udp_port = self._transport.get_extra_info("sockname")[1]
        self._task = asyncio.create_task(self._run(), name="upstream-mqtt-server")
        async with asyncio.timeout(bound(10)):
            await self.ready.wait()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        while self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.wait([self._task], timeout=0.5)
        if self._transport is not None:
            self._transport.close()

    async def _run(self) -> None:
        user, password = SERVER_LOGIN
        while True:
            client = aiomqtt.Client("127.0.0.1", self.broker.port, username=user,
                                    password=password, identifier="server")  # fmt: skip
            with contextlib.suppress(aiomqtt.MqttError):
                async with client:
                    honour_cancellation()
                    await client.subscribe(PUBLISH_TOPIC, qos=0)
                    honour_cancellation()
                    self._client = client
                    self.ready.set()
                    async for message in client.messages:
                        assert isinstance(message.payload, bytes)
                        await self._on_message(message.payload)
            self._client = None
            self.ready.clear()
            await asyncio.sleep(0.1)

    async def send(self, message: JsonObject | bytes) -> None:
        """Publish to the device's p2p topic."""
        assert self._client is not None, "server not connected"
        raw = message if isinstance(message, bytes) else json.dumps(message).encode()
        await self._client.publish(self.p2p, raw, qos=0)

    async def _on_message(self, raw: bytes) -> None:
        self.received.append(raw)
        message = json.loads(raw)
        kind = message.get("type")
        if kind == "hello":
            await self._hello()
        elif kind == "goodbye":
            self.goodbyes.append(message)
            self.goodbye.set()
        elif kind == "mcp":
            await self._on_mcp(message["payload"])

    @property
    def session_id(self) -> str:
        """The ``session_id`` of the last hello reply: the conversation running."""
        return str(json.loads(self.hello_replies[-1])["session_id"])

    async def said_goodbye(self) -> JsonObject:
        """The first goodbye the server received, once it came."""
        async with asyncio.timeout(bound(10)):
            await self.goodbye.wait()
        return self.goodbyes[0]

    async def _hello(self) -> None:
        reply = json.dumps({
            "type": "hello", "version": 3, "transport": "udp",
            "session_id": secrets.token_hex(8),
            "audio_params": {"format": "opus", "sample_rate": 24000, "channels": 1,
                             "frame_duration": 60},
            "udp": {"server": "127.0.0.1", "port": self.udp_port,
                    "key": secrets.token_hex(16), "nonce": "01" + secrets.token_hex(15)},
        }).encode()  # fmt: skip
        self.hello_replies.append(reply)
        await self.send(reply)
        self._listing = []
        params = {"protocolVersion": "2024-11-05", "capabilities": {"vision": self.vision},
                  "clientInfo": {"name": "xiaozhi-server", "version": "0.8"}}  # fmt: skip
        await self.send(_mcp({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params}))

    async def _on_mcp(self, payload: JsonObject) -> None:
        request_id = int(payload["id"])  # as the real server parses it
        if request_id == 1 and "serverInfo" in payload.get("result", {}):
            await self._list(None)
        elif request_id == 2 and "tools" in payload.get("result", {}):
            self._listing += payload["result"]["tools"]
            cursor = payload["result"].get("nextCursor")
            if cursor:
                await self._list(cursor)
            else:
                self.tools.put_nowait(self._listing)
        future = self._replies.pop(request_id, None)
        if future is not None and not future.done():
            future.set_result(payload)

    async def _list(self, cursor: str | None) -> None:
        params = {"cursor": cursor} if cursor else {}
        await self.send(_mcp({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": params}))

    async def request(self, request_id: int, method: str, params: JsonObject) -> JsonObject:
        """Send one MCP request with ``request_id`` (xiaozhi-mqtt-gateway's are from 10000);
        its reply."""
        future = self._replies[request_id] = asyncio.get_running_loop().create_future()
        request = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        await self.send(_mcp(request))
        async with asyncio.timeout(bound(10)):
            reply: JsonObject = await future
        return reply

    async def call(self, name: str, arguments: JsonObject | None = None) -> JsonObject:
        """Call a tool of the device with the next id of the server's counter; the reply."""
        self._counter += 1
        call_id = self._counter
        future = self._replies[call_id] = asyncio.get_running_loop().create_future()
        request = {"jsonrpc": "2.0", "id": call_id, "method": "tools/call",
                   "params": {"name": name, "arguments": arguments or {}}}  # fmt: skip
        await self.send(_mcp(request))
        async with asyncio.timeout(bound(10)):
            reply: JsonObject = await future
        return reply


def _mcp(payload: JsonObject) -> JsonObject:
    return {"type": "mcp", "payload": payload}


async def upstream_broker(workdir: Any, *macs: str) -> Mosquitto:
    """A mosquitto that admits the server and the devices ``macs`` with their upstream logins."""
    users = dict([SERVER_LOGIN, *(device_login(mac) for mac in macs)])
    broker = Mosquitto(workdir, users=users)
    await broker.start()
    return broker
