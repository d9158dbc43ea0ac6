"""MQTT 3.1.1 packets a device-facing server reads, and the bytes it writes (sans-I/O).

Only what the embedded broker needs: a client's CONNECT, PUBLISH (QoS 0 and 1), PUBACK,
SUBSCRIBE, UNSUBSCRIBE, PINGREQ and DISCONNECT are read (``mqtt_reader.MqttReader``); the
server's CONNACK, PUBLISH, PUBACK, SUBACK, UNSUBACK and PINGRESP are written here. Section
numbers are those of the OASIS MQTT 3.1.1 standard. Stock firmware never uses QoS 2
(reference/xiaozhi-protocol.md §2), so the server refuses it rather than keep its four-way state.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ACCEPTED",
    "BAD_CREDENTIALS",
    "IDENTIFIER_REJECTED",
    "MAX_REMAINING_LENGTH",
    "NOT_AUTHORIZED",
    "PINGRESP",
    "REFUSED_FILTER",
    "UNACCEPTABLE_PROTOCOL",
    "Connect",
    "Disconnect",
    "MalformedPacket",
    "Packet",
    "PingReq",
    "PubAck",
    "Publish",
    "Subscribe",
    "Unsubscribe",
    "Will",
    "connack",
    "puback",
    "publish",
    "remaining_length",
    "suback",
    "unsuback",
]

# §3.2.2.3 CONNACK return codes (those the server uses)
ACCEPTED = 0
UNACCEPTABLE_PROTOCOL = 1
IDENTIFIER_REJECTED = 2
BAD_CREDENTIALS = 4
NOT_AUTHORIZED = 5

REFUSED_FILTER = 0x80  # §3.9.3 SUBACK: failure
PINGRESP = b"\xd0\x00"  # §3.13

MAX_REMAINING_LENGTH = 268_435_455  # §2.2.3: four bytes of 7 bits


class MalformedPacket(Exception):
    """The client sent bytes that are not an MQTT 3.1.1 packet this server accepts.

    The server closes the connection (§4.8: a protocol violation closes the network connection);
    the message says why, for the log.
    """


@dataclass(frozen=True, slots=True)
class Will:
    """A CONNECT's last will: published for the client if its connection ends abnormally."""

    topic: str
    payload: bytes
    qos: int
    retain: bool


@dataclass(frozen=True, slots=True)
class Connect:
    """§3.1 CONNECT. ``level`` 4 is MQTT 3.1.1, 3 is MQTT 3.1; any other level carries nothing
    else (the server answers it with ``UNACCEPTABLE_PROTOCOL``)."""

    level: int
    client_id: str = ""
    username: str | None = None
    password: bytes | None = None
    keepalive: int = 0
    clean_session: bool = True
    will: Will | None = None


@dataclass(frozen=True, slots=True)
class Publish:
    """§3.3 PUBLISH (QoS 0 or 1; ``packet_id`` is 0 for QoS 0)."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    packet_id: int = 0
    dup: bool = False


@dataclass(frozen=True, slots=True)
class PubAck:
    """§3.4 PUBACK: the client got a QoS 1 PUBLISH."""

    packet_id: int


@dataclass(frozen=True, slots=True)
class Subscribe:
    """§3.8 SUBSCRIBE: topic filters, each with the QoS asked for."""

    packet_id: int
    filters: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """§3.10 UNSUBSCRIBE."""

    packet_id: int
    filters: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PingReq:
    """§3.12 PINGREQ."""


@dataclass(frozen=True, slots=True)
class Disconnect:
    """§3.14 DISCONNECT: a clean end (no will)."""


Packet = Connect | Publish | PubAck | Subscribe | Unsubscribe | PingReq | Disconnect


def remaining_length(n: int) -> bytes:
    """§2.2.3: ``n`` in the variable-length encoding of the fixed header."""
    if not 0 <= n <= MAX_REMAINING_LENGTH:
        raise ValueError(f"an MQTT packet cannot hold {n} bytes")
    out = bytearray()
    while True:
        n, digit = divmod(n, 128)
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + remaining_length(len(body)) + body


def connack(code: int, session_present: bool = False) -> bytes:
    """§3.2 CONNACK with return ``code`` (session present only when accepted)."""
    return bytes((0x20, 2, 1 if session_present and code == ACCEPTED else 0, code))


def publish(
    topic: str, payload: bytes, qos: int = 0, retain: bool = False, packet_id: int = 0
) -> bytes:
    """§3.3 PUBLISH as the server sends it (a ``packet_id`` for QoS 1)."""
    name = topic.encode()
    head = len(name).to_bytes(2, "big") + name
    if qos:
        head += packet_id.to_bytes(2, "big")
    return _packet(0x30 | qos << 1 | retain, head + payload)


def puback(packet_id: int) -> bytes:
    """§3.4 PUBACK."""
    return b"\x40\x02" + packet_id.to_bytes(2, "big")


def suback(packet_id: int, codes: list[int]) -> bytes:
    """§3.9 SUBACK: a granted QoS or ``REFUSED_FILTER`` per filter, in order."""
    return _packet(0x90, packet_id.to_bytes(2, "big") + bytes(codes))


def unsuback(packet_id: int) -> bytes:
    """§3.11 UNSUBACK."""
    return b"\xb0\x02" + packet_id.to_bytes(2, "big")
