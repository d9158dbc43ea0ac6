"""``MqttReader``: a client's byte stream in, MQTT 3.1.1 packets out (sans-I/O).

The size limit is checked on the fixed header: a packet whose remaining length is over
``max_packet_bytes`` raises before a byte of its body is kept, so a client announcing 200 MB
costs the server nothing. Every way a client's bytes can be wrong (a fifth length byte, flags
the type forbids, bad UTF-8, a field cut short, trailing bytes, a packet type only a server
sends, QoS 2) raises ``MalformedPacket``; the reader is then done and the connection closes.
"""

from __future__ import annotations

from collections.abc import Iterator

from gateway.protocol.mqtt import (
    Connect,
    Disconnect,
    MalformedPacket,
    Packet,
    PingReq,
    PubAck,
    Publish,
    Subscribe,
    Unsubscribe,
    Will,
)

__all__ = ["MqttReader", "check_filter"]

# §3.1.2.1-2: the protocol name of each level this server speaks
_PROTOCOLS = {4: b"MQTT", 3: b"MQIsdp"}
# Packet types a client sends (§2.2.1), each with the fixed-header flags it must carry (§2.2.2)
_FLAGS = {1: 0, 4: 0, 8: 0b0010, 10: 0b0010, 12: 0, 14: 0}
_NAMES = {2: "CONNACK", 5: "PUBREC", 6: "PUBREL", 7: "PUBCOMP", 9: "SUBACK", 11: "UNSUBACK",
          13: "PINGRESP"}  # fmt: skip


class _Fields:
    """A packet's body, read field by field (§1.5)."""

    __slots__ = ("_at", "_data")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._at = 0

    def take(self, n: int, what: str) -> bytes:
        end = self._at + n
        if end > len(self._data):
            raise MalformedPacket(f"packet ends inside its {what}")
        chunk = self._data[self._at : end]
        self._at = end
        return chunk

    def byte(self, what: str) -> int:
        return self.take(1, what)[0]

    def integer(self, what: str) -> int:
        return int.from_bytes(self.take(2, what), "big")

    def binary(self, what: str) -> bytes:
        return self.take(self.integer(what), what)

    def text(self, what: str) -> str:
        # §1.5.3: well-formed UTF-8 without U+0000
        try:
            text = self.binary(what).decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedPacket(f"{what} is not UTF-8") from None
        if "\0" in text:
            raise MalformedPacket(f"{what} holds U+0000")
        return text

    def packet_id(self) -> int:
        packet_id = self.integer("packet identifier")
        if not packet_id:
            raise MalformedPacket("packet identifier 0")  # §2.3.1
        return packet_id

    def rest(self) -> bytes:
        chunk = self._data[self._at :]
        self._at = len(self._data)
        return chunk

    @property
    def done(self) -> bool:
        return self._at == len(self._data)


def check_filter(text: str) -> bool:
    """§4.7.1: True if ``text`` is a valid topic filter (wildcards as whole levels, # last)."""
    if not text:
        return False
    levels = text.split("/")
    for n, level in enumerate(levels):
        if "#" in level and (level != "#" or n != len(levels) - 1):
            return False
        if "+" in level and level != "+":
            return False
    return True


def _connect(body: _Fields) -> Connect:
    name = body.binary("protocol name")
    level = body.byte("protocol level")
    if level not in _PROTOCOLS:
        return Connect(level)  # MQTT 5, say: refused with UNACCEPTABLE_PROTOCOL
    if _PROTOCOLS[level] != name:
        raise MalformedPacket(f"protocol name {name!r} at level {level}")  # §3.1.2.1
    flags = body.byte("connect flags")
    keepalive = body.integer("keep alive")
    if flags & 0x01:
        raise MalformedPacket("CONNECT reserved flag set")  # §3.1.2.3
    client_id = body.text("client identifier")
    will = None
    will_qos, will_retain = flags >> 3 & 0x03, bool(flags & 0x20)
    if flags & 0x04:
        if will_qos > 2:
            raise MalformedPacket("will QoS 3")
        topic = body.text("will topic")
        if not topic or "+" in topic or "#" in topic:
            raise MalformedPacket("will topic is not a topic name")
        will = Will(topic, body.binary("will message"), will_qos, will_retain)
    elif will_qos or will_retain:
        raise MalformedPacket("will QoS or retain without a will")  # §3.1.2.9
    username = body.text("user name") if flags & 0x80 else None
    if flags & 0x40 and username is None:
        raise MalformedPacket("password without a user name")  # §3.1.2.9 (MQTT-3.1.2-22)
    password = body.binary("password") if flags & 0x40 else None
    return Connect(level, client_id, username, password, keepalive, bool(flags & 0x02), will)


def _publish(flags: int, body: _Fields) -> Publish:
    qos = flags >> 1 & 0x03
    if qos == 3:
        raise MalformedPacket("PUBLISH with QoS 3")
    if qos == 2:
        raise MalformedPacket("PUBLISH with QoS 2, which this server does not take")
    topic = body.text("topic name")
    if not topic or "+" in topic or "#" in topic:
        raise MalformedPacket("PUBLISH topic is not a topic name")  # §3.3.2.1
    packet_id = body.packet_id() if qos else 0
    return Publish(topic, body.rest(), qos, bool(flags & 0x01), packet_id, bool(flags & 0x08))


def _subscribe(body: _Fields) -> Subscribe:
    packet_id = body.packet_id()
    filters = []
    while not body.done:
        text = body.text("topic filter")
        qos = body.byte("requested QoS")
        if qos > 2:
            raise MalformedPacket("SUBSCRIBE requested QoS over 2")  # §3.8.3-4
        filters.append((text, qos))
    if not filters:
        raise MalformedPacket("SUBSCRIBE without a topic filter")  # §3.8.3-3
    return Subscribe(packet_id, tuple(filters))


def _unsubscribe(body: _Fields) -> Unsubscribe:
    packet_id = body.packet_id()
    filters = []
    while not body.done:
        filters.append(body.text("topic filter"))
    if not filters:
        raise MalformedPacket("UNSUBSCRIBE without a topic filter")  # §3.10.3-2
    return Unsubscribe(packet_id, tuple(filters))


def _decode(kind: int, flags: int, data: bytes) -> Packet:
    body = _Fields(data)
    packet: Packet
    if kind == 1:
        packet = _connect(body)
        if packet.level not in _PROTOCOLS:
            return packet  # the rest is another version's: not read
    elif kind == 3:
        packet = _publish(flags, body)
    elif kind == 4:
        packet = PubAck(body.packet_id())
    elif kind == 8:
        packet = _subscribe(body)
    elif kind == 10:
        packet = _unsubscribe(body)
    else:
        packet = PingReq() if kind == 12 else Disconnect()
    if not body.done:
        raise MalformedPacket(f"{type(packet).__name__.upper()} has bytes after its fields")
    return packet


class MqttReader:
    """Parses one client's stream; ``feed()`` returns the packets completed so far (``packets()``
    yields them one by one)."""

    __slots__ = ("_buffer", "_header", "max_packet_bytes")

    def __init__(self, max_packet_bytes: int) -> None:
        self.max_packet_bytes = max_packet_bytes
        self._buffer = bytearray()
        self._header: tuple[int, int, int] | None = None  # first byte, header size, length

    def feed(self, data: bytes) -> list[Packet]:
        """Take the next bytes of the stream; every packet they complete.

        Raises:
            MalformedPacket: as ``packets()``.
        """
        return list(self.packets(data))

    def packets(self, data: bytes) -> Iterator[Packet]:
        """Take the next bytes of the stream; each packet they complete, parsed as it is asked
        for: a server that stops asking (the connection closed) parses none of the rest.

        Raises:
            MalformedPacket: the stream holds a packet this server does not accept (also one
                over ``max_packet_bytes``, found from its fixed header before its body).
        """
        buffer = self._buffer
        buffer += data
        while True:
            if self._header is None:
                self._header = self._fixed_header()
                if self._header is None:
                    return
            first, size, length = self._header
            if len(buffer) < size + length:
                return
            body = bytes(buffer[size : size + length])
            del buffer[: size + length]
            self._header = None
            yield _decode(first >> 4, first & 0x0F, body)

    def _fixed_header(self) -> tuple[int, int, int] | None:
        buffer = self._buffer
        if not buffer:
            return None
        first = buffer[0]
        kind, flags = first >> 4, first & 0x0F
        if kind != 3 and _FLAGS.get(kind) != flags:
            name = _NAMES.get(kind)
            if name is not None:
                raise MalformedPacket(f"{name} is not a packet a client sends")
            if kind in _FLAGS:
                raise MalformedPacket(f"packet type {kind} with flags {flags:#06b}")
            raise MalformedPacket(f"reserved packet type {kind}")
        length, shift = 0, 0
        for n in range(1, 5):
            if n >= len(buffer):
                return None
            digit = buffer[n]
            length |= (digit & 0x7F) << shift
            shift += 7
            if not digit & 0x80:
                if length > self.max_packet_bytes:
                    raise MalformedPacket(
                        f"packet of {length} bytes, over the limit of {self.max_packet_bytes}"
                    )
                return first, n + 1, length
        raise MalformedPacket("remaining length longer than 4 bytes")  # §2.2.3
