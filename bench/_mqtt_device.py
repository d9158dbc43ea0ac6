"""A lean stock MQTT device for the benches: the OTA check-in and an MQTT 3.1.1 session, each
an ``asyncio.Protocol`` on a raw socket, so that thousands fit in one worker's loop.

``aiomqtt`` (paho underneath) costs a device far more than the raw-socket WebSocket devices of
``_fleet_devices``: a task per client, paho's packet objects and queues, a message iterator and
a misc timer each; the workers then set the pace of an MQTT storm, not the server. This device
does on the wire what stock firmware does and nothing more (docs/protocol.md §2-§3;
reference: esp-mqtt): the OTA POST, CONNECT with the issued login (MQTT 3.1.1, clean session,
the OTA reply's keepalive), PUBLISH QoS 0 to its ``publish_topic``, PINGREQ once a keepalive of
silence on its side, PUBACK for a QoS 1 delivery. Stock firmware never subscribes; a device
with ``announce`` (for a broker that does not subscribe devices itself, mosquitto) subscribes
to its ``down`` topic and says hello once the SUBACK is back.

Packets out are encoded with the gateway's own sans-I/O codec where it has them (``publish``,
``puback``, ``remaining_length``), the few a server never writes here; packets in (CONNACK,
SUBACK, PUBLISH, PINGRESP) are read by ``ServerPackets``, which trusts the server as a device
does and keeps only what a device looks at.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

from gateway.protocol.mqtt import puback, publish, remaining_length

__all__ = ["Handler", "MqttSession", "ServerPackets", "check_in", "connect_packet",
           "subscribe_packet"]  # fmt: skip

PINGREQ = b"\xc0\x00"  # §3.12
_CONNACK, _PUBLISH, _SUBACK = 2, 3, 9  # §2.2.1 packet types a device reads


def _string(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return len(data).to_bytes(2, "big") + data


def connect_packet(
    client_id: str, username: str | None, password: str | None, keepalive: int
) -> bytes:
    """§3.1 CONNECT, MQTT 3.1.1, clean session, no will (a login without a user name is
    anonymous)."""
    login = b"" if username is None else _string(username) + _string(password or "")
    flags = b"\x02" if username is None else b"\xc2"
    body = _string("MQTT") + b"\x04" + flags + keepalive.to_bytes(2, "big") + _string(client_id)
    return b"\x10" + remaining_length(len(body + login)) + body + login


def subscribe_packet(packet_id: int, topic_filter: str, qos: int = 0) -> bytes:
    """§3.8 SUBSCRIBE to one filter."""
    body = packet_id.to_bytes(2, "big") + _string(topic_filter) + bytes((qos,))
    return b"\x82" + remaining_length(len(body)) + body


class ServerPackets:
    """A server's byte stream in, ``(type, flags, body)`` of each whole packet out."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> Iterator[tuple[int, int, bytes]]:
        """Take the next bytes; yield each packet they complete."""
        buffer = self._buffer + data if self._buffer else data
        at, end = 0, len(buffer)
        while at + 2 <= end:
            length, shift, n = 0, 0, at + 1
            while True:  # §2.2.3
                if n >= end:
                    self._buffer = buffer[at:]
                    return
                digit = buffer[n]
                length |= (digit & 0x7F) << shift
                shift, n = shift + 7, n + 1
                if not digit & 0x80:
                    break
            if n + length > end:
                break
            first = buffer[at]
            yield first >> 4, first & 0x0F, buffer[n : n + length]
            at = n + length
        self._buffer = buffer[at:]


Handler = Callable[["MqttSession", str, bytes], None]
"""What a session does with each message delivered to it: ``(session, topic, payload)``."""


class MqttSession(asyncio.Protocol):
    """One client's MQTT connection: logs in, then hands each message to ``on_message``.

    ``topic`` is where ``publish`` goes unless told otherwise. With ``subscribe``, the session
    subscribes to that filter once connected, and with ``announce`` it then says hello on
    ``topic``. ``connected`` resolves with the CONNACK's return code, ``lost`` when the
    connection ends.
    """

    __slots__ = ("_announce", "_keepalive", "_login", "_on_message", "_packets", "_sent_at",
                 "_subscribe", "_timer", "_topic", "_transport", "connected", "lost")  # fmt: skip

    def __init__(
        self,
        login: bytes,
        topic: str,
        keepalive: int,
        on_message: Handler,
        subscribe: str | None = None,
        announce: bool = False,
    ) -> None:
        loop = asyncio.get_running_loop()
        self._login = login
        self._topic = topic
        self._keepalive = keepalive
        self._on_message = on_message
        self._subscribe = subscribe
        self._announce = announce
        self._packets = ServerPackets()
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._sent_at = 0.0
        self.connected: asyncio.Future[int] = loop.create_future()
        self.lost: asyncio.Future[None] = loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._write(self._login)

    def abort(self) -> None:
        """Drop the connection at once (no DISCONNECT: its end is abnormal)."""
        if self._transport is not None:
            self._transport.abort()

    def _write(self, data: bytes) -> None:
        assert self._transport is not None
        self._transport.write(data)
        self._sent_at = asyncio.get_running_loop().time()

    def publish(self, text: str, topic: str | None = None) -> None:
        """PUBLISH ``text`` at QoS 0 to ``topic`` (by default the session's own)."""
        self._write(publish(topic or self._topic, text.encode()))

    def data_received(self, data: bytes) -> None:
        for kind, flags, body in self._packets.feed(data):
            if kind == _PUBLISH:
                self._delivered(flags, body)
            elif kind == _CONNACK:
                self._connack(body[1] if len(body) > 1 else 255)
            elif kind == _SUBACK and self._announce:
                self.publish('{"type":"hello"}')
            # PINGRESP: nothing to do (esp-mqtt only notes that the server is there)

    def _connack(self, code: int) -> None:
        if not self.connected.done():
            self.connected.set_result(code)
        if code:
            self.abort()
            return
        if self._keepalive:
            self._timer = asyncio.get_running_loop().call_later(self._keepalive, self._ping)
        if self._subscribe is not None:
            self._write(subscribe_packet(1, self._subscribe))

    def _delivered(self, flags: int, body: bytes) -> None:
        at = 2 + int.from_bytes(body[:2], "big")
        topic = body[2:at].decode()
        if flags & 0x06:  # QoS 1
            self._write(puback(int.from_bytes(body[at : at + 2], "big")))
            at += 2
        self._on_message(self, topic, body[at:])

    def _ping(self) -> None:
        # esp-mqtt: a PINGREQ once a keepalive has passed since the device last sent anything
        loop = asyncio.get_running_loop()
        due = self._sent_at + self._keepalive
        if loop.time() >= due:
            self._write(PINGREQ)
            due = self._sent_at + self._keepalive
        self._timer = loop.call_at(due, self._ping)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._transport = None
        if not self.connected.done():
            self.connected.set_result(255)  # no CONNACK: never connected
        if not self.lost.done():
            self.lost.set_result(None)


def _ota_request(url: str, device_id: str, client_id: str) -> tuple[str, int, bytes]:
    """The stock OTA request (docs/protocol.md §3): host, port and the bytes of the POST."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    body = json.dumps({
        "version": 2, "language": "en-US", "flash_size": 16777216,
        "minimum_free_heap_size": "123456", "mac_address": device_id,
        "uuid": client_id, "chip_model_name": "esp32s3",
        "application": {"name": "xiaozhi", "version": "1.0.0"},
        "board": {"type": "bench-board", "name": "bench-board", "mac": device_id},
    }).encode()  # fmt: skip
    head = (
        f"POST {parts.path} HTTP/1.1\r\nHost: {host}:{port}\r\nActivation-Version: 1\r\n"
        f"Device-Id: {device_id}\r\nClient-Id: {client_id}\r\n"
        "User-Agent: bench-board/1.0.0\r\nAccept-Language: en-US\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return host, port, head.encode() + body


class _OtaExchange(asyncio.Protocol):
    """One POST over its own connection; the reply is whatever the server sent until it closed
    (``Connection: close``)."""

    __slots__ = ("_chunks", "_request", "reply")

    def __init__(self, request: bytes) -> None:
        self._request = request
        self._chunks: list[bytes] = []
        self.reply: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        self._chunks.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.reply.done():
            if exc is None:
                self.reply.set_result(b"".join(self._chunks))
            else:
                self.reply.set_exception(exc)


async def check_in(url: str, device_id: str, client_id: str) -> dict[str, Any]:
    """POST the stock OTA request at ``url``; the reply's ``mqtt`` block.

    Raises:
        OSError: no connection.
        ValueError: the server did not answer 200 with an ``mqtt`` block.
    """
    host, port, request = _ota_request(url, device_id, client_id)
    loop = asyncio.get_running_loop()
    transport, exchange = await loop.create_connection(lambda: _OtaExchange(request), host, port)
    try:
        data = await exchange.reply
    finally:
        transport.abort()
    status, _, rest = data.partition(b"\r\n")
    if status.split()[1:2] != [b"200"]:
        raise ValueError(f"OTA answered {status.decode(errors='replace')}")
    reply = json.loads(rest.partition(b"\r\n\r\n")[2])
    if not isinstance(reply, dict) or not isinstance(reply.get("mqtt"), dict):
        raise ValueError("the OTA reply has no mqtt block")
    mqtt: dict[str, Any] = reply["mqtt"]
    return mqtt
