"""A small MQTT 3.1.1 client on asyncio streams (what the MQTT link needs, nothing more).

CONNECT with a last will and credentials, SUBSCRIBE, PUBLISH at QoS 0/1 (incoming QoS 1 is
acknowledged), PINGREQ and DISCONNECT. Unlike umqtt.simple, nothing here blocks the event
loop, so tool calls and the broker traffic share one asyncio loop; it also runs on CPython.
"""

import asyncio
import struct

import fw_compat as compat

CONNECT, CONNACK, PUBLISH, PUBACK, SUBSCRIBE, SUBACK = 0x10, 0x20, 0x30, 0x40, 0x82, 0x90
PINGREQ, PINGRESP, DISCONNECT = 0xC0, 0xD0, 0xE0
MAX_PACKET = 65536


class MqttError(Exception):
    """The broker refused the connection (``code`` is the CONNACK return code)."""

    def __init__(self, code):
        super().__init__("MQTT connection refused, code %d" % code)
        self.code = code


def _str(value):
    data = value.encode() if isinstance(value, str) else value
    return struct.pack("!H", len(data)) + data


def _packet(kind, body):
    size, length = len(body), bytearray()
    while True:  # the remaining length is a base-128 varint
        digit, size = size & 0x7F, size >> 7
        length.append(digit | (0x80 if size else 0))
        if not size:
            return bytes((kind,)) + bytes(length) + body


class MqttClient:
    """One connection to a broker. ``will`` is (topic, message, retain, qos) or None."""

    def __init__(self, client_id, host, port=1883, user=None, password=None, keepalive=60,
                 will=None, tls=False):  # fmt: skip
        self.client_id = client_id
        self.host = host
        self.port = port
        self.user = user
        self.password = password
        self.keepalive = keepalive
        self.will = will
        self.tls = tls
        self.writer = None
        self._reader = None
        self._pid = 0
        self._queued = []
        self._lock = asyncio.Lock()

    async def connect(self, timeout=10):
        """Connect and wait for the CONNACK; MqttError if refused, OSError if unreachable."""
        extra = {"ssl": True} if self.tls else {}
        opening = asyncio.open_connection(self.host, self.port, **extra)
        self._reader, self.writer = await compat.wait_for(opening, timeout)
        flags = 0x02  # clean session
        payload = _str(self.client_id)
        if self.will:
            topic, message, retain, qos = self.will
            flags |= 0x04 | qos << 3 | (0x20 if retain else 0)
            payload += _str(topic) + _str(message)
        if self.user is not None:
            flags |= 0x80
            payload += _str(self.user)
        if self.password is not None:
            flags |= 0x40
            payload += _str(self.password)
        header = _str("MQTT") + bytes((4, flags)) + struct.pack("!H", self.keepalive)
        try:
            await self._write(_packet(CONNECT, header + payload))
            kind, body = await compat.wait_for(self._read_packet(), timeout)
        except BaseException:
            self.abort()
            raise
        if kind != CONNACK or len(body) < 2 or body[1]:
            self.abort()
            raise MqttError(body[1] if kind == CONNACK and len(body) > 1 else 255)

    async def subscribe(self, topic, qos=1, timeout=10):
        """Subscribe and wait for the SUBACK (messages arriving meanwhile are kept)."""
        pid = self._next_pid()
        await self._write(_packet(SUBSCRIBE, struct.pack("!H", pid) + _str(topic) + bytes((qos,))))
        while True:
            kind, body = await compat.wait_for(self._read_packet(), timeout)
            if kind == SUBACK:
                if body[2:3] == b"\x80":
                    raise MqttError(0x80)
                return
            if kind & 0xF0 == PUBLISH:
                self._queued.append(await self._on_publish(kind, body))

    async def publish(self, topic, message, retain=False, qos=0):
        """Publish without waiting for the broker's acknowledgement."""
        data = message.encode() if isinstance(message, str) else message
        head = _str(topic)
        if qos:
            head += struct.pack("!H", self._next_pid())
        kind = PUBLISH | qos << 1 | (1 if retain else 0)
        await self._write(_packet(kind, head + data))

    async def ping(self):
        """Send a PINGREQ (the broker answers, so read() sees a live link)."""
        await self._write(bytes((PINGREQ, 0)))

    async def read(self, timeout=None):
        """The next (topic, payload bytes), or None once the connection is gone.

        ``timeout`` bounds the wait for each packet (a PINGRESP counts), not for a message.
        """
        if self._queued:
            return self._queued.pop(0)
        try:
            while True:
                kind, body = await compat.wait_for(self._read_packet(), timeout)
                if kind & 0xF0 == PUBLISH:
                    return await self._on_publish(kind, body)
        except (OSError, EOFError, ValueError, asyncio.TimeoutError) as exc:
            compat.log(compat.INFO, "MQTT connection lost: %r", exc)
            self.abort()
            return None

    async def disconnect(self):
        """Say goodbye (the broker then drops the will) and close."""
        try:
            await self._write(bytes((DISCONNECT, 0)))
        except OSError:
            pass
        self.abort()

    def abort(self):
        """Drop the connection at once; the broker publishes the will."""
        if self.writer is not None:
            compat.abort(self.writer)
            self.writer = None

    async def _on_publish(self, kind, body):
        size = struct.unpack("!H", body[:2])[0]
        topic, rest = body[2 : 2 + size].decode(), body[2 + size :]
        if kind & 0x06:  # QoS 1 (we never subscribe at QoS 2): acknowledge it
            await self._write(_packet(PUBACK, rest[:2]))
            rest = rest[2:]
        return topic, rest

    async def _read_packet(self):
        read = self._reader.readexactly
        kind = (await read(1))[0]
        size, shift = 0, 0
        while True:
            digit = (await read(1))[0]
            size |= (digit & 0x7F) << shift
            shift += 7
            if not digit & 0x80:
                break
            if shift > 21:
                raise ValueError("bad MQTT remaining length")
        if size > MAX_PACKET:
            raise ValueError("a %d-byte MQTT packet is over the limit" % size)
        return kind, (await read(size) if size else b"")

    async def _write(self, data):
        if self.writer is None:
            raise OSError("MQTT not connected")
        async with self._lock:
            self.writer.write(data)
            await self.writer.drain()

    def _next_pid(self):
        self._pid = self._pid % 65535 + 1
        return self._pid
