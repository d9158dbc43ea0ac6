"""A client's bytes in, MQTT packets out; every malformed stream is one clear error."""

from __future__ import annotations

import random

import pytest

from gateway.protocol.mqtt import (
    Connect,
    Disconnect,
    MalformedPacket,
    PingReq,
    PubAck,
    Publish,
    Subscribe,
    Unsubscribe,
    Will,
    remaining_length,
)
from gateway.protocol.mqtt_reader import MqttReader, check_filter

LIMIT = 1024


def field(data: str | bytes) -> bytes:
    raw = data.encode() if isinstance(data, str) else data
    return len(raw).to_bytes(2, "big") + raw


def packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + remaining_length(len(body)) + body


def connect(
    flags: int = 0xC2, payload: bytes = field("dev") + field("user") + field("pw"),
    name: bytes = b"MQTT", level: int = 4,
) -> bytes:  # fmt: skip
    return packet(0x10, field(name) + bytes((level, flags)) + b"\x00\x3c" + payload)


def read(data: bytes) -> list[object]:
    return list(MqttReader(LIMIT).feed(data))


def test_a_full_connect_is_read() -> None:
    """Client id, login, keepalive, clean session and a will."""
    will = field("dev/status") + field(b"offline")
    flags = 0x80 | 0x40 | 0x20 | 0x08 | 0x04 | 0x02  # user, password, will retain, QoS 1, clean
    payload = field("dev") + will + field("user") + field(b"\xffpw")
    assert read(connect(flags, payload)) == [
        Connect(4, "dev", "user", b"\xffpw", 60, True, Will("dev/status", b"offline", 1, True))
    ]


def test_mqtt_3_1_is_read_and_another_level_is_left_for_the_server_to_refuse() -> None:
    """MQIsdp level 3 is MQTT 3.1; an MQTT 5 CONNECT (properties and all) is not parsed."""
    assert read(connect(0x00, field("x"), b"MQIsdp", 3)) == [
        Connect(3, "x", keepalive=60, clean_session=False)
    ]
    assert read(connect(0xC2, b"\x00" + field("x"), level=5)) == [Connect(5)]


def test_packets_split_anywhere_come_out_whole_and_in_order() -> None:
    """Byte by byte, or many packets in one read: the same packets."""
    stream = (
        connect()
        + packet(0x30, field("t/up") + b"hi")
        + packet(0x32, field("t/up") + b"\x00\x05" + b"q1")
        + packet(0x3B, field("t/up") + b"\x00\x06")
        + packet(0x40, b"\x00\x09")
        + packet(0x82, b"\x00\x01" + field("a/+") + b"\x01" + field("#") + b"\x00")
        + packet(0xA2, b"\x00\x02" + field("a/+"))
        + b"\xc0\x00\xe0\x00"
    )
    expected = [
        Connect(4, "dev", "user", b"pw", 60, True),
        Publish("t/up", b"hi"),
        Publish("t/up", b"q1", 1, packet_id=5),
        Publish("t/up", b"", 1, True, 6, dup=True),
        PubAck(9),
        Subscribe(1, (("a/+", 1), ("#", 0))),
        Unsubscribe(2, ("a/+",)),
        PingReq(),
        Disconnect(),
    ]
    assert read(stream) == expected
    reader = MqttReader(LIMIT)
    assert [p for n in range(len(stream)) for p in reader.feed(stream[n : n + 1])] == expected


def test_a_packet_over_the_limit_is_refused_from_its_header() -> None:
    """No byte of the body is needed (or kept): the header alone decides."""
    reader = MqttReader(LIMIT)
    assert reader.feed(packet(0x30, field("t") + b"x" * (LIMIT - 3))) == [
        Publish("t", b"x" * (LIMIT - 3))
    ]
    with pytest.raises(MalformedPacket, match="over the limit of 1024"):
        reader.feed(b"\x30" + remaining_length(200 * 1024 * 1024))


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"\x30\xff\xff\xff\xff\x01", "longer than 4 bytes"),
        (b"\x00\x00", "reserved packet type 0"),
        (b"\xf0\x00", "reserved packet type 15"),
        (b"\x20\x02\x00\x00", "CONNACK is not a packet a client sends"),
        (b"\x62\x02\x00\x01", "PUBREL is not"),
        (b"\x90\x03\x00\x01\x00", "SUBACK is not"),
        (b"\xd0\x00", "PINGRESP is not"),
        (b"\x80\x03\x00\x01\x00", "packet type 8 with flags 0b0000"),
        (b"\xc1\x00", "packet type 12 with flags"),
        (b"\x36\x05\x00\x01t\x00\x01", "QoS 3"),
        (b"\x34\x05\x00\x01t\x00\x01", "QoS 2, which this server does not take"),
        (packet(0x30, field(b"\xc3\x28")), "topic name is not UTF-8"),
        (packet(0x30, field("a\0b")), "holds U+0000"),
        (packet(0x30, field("a/+")), "not a topic name"),
        (packet(0x30, field("")), "not a topic name"),
        (packet(0x30, b"\x00\x09ab"), "ends inside its topic name"),
        (packet(0x32, field("t") + b"\x00\x00"), "packet identifier 0"),
        (packet(0x40, b"\x00\x01\x00"), "PUBACK has bytes after its fields"),
        (b"\xc0\x01\x00", "PINGREQ has bytes after"),
        (packet(0x82, b"\x00\x01"), "SUBSCRIBE without a topic filter"),
        (packet(0x82, b"\x00\x01" + field("a") + b"\x03"), "requested QoS over 2"),
        (packet(0x82, b"\x00\x01" + field("a")), "ends inside its requested QoS"),
        (packet(0xA2, b"\x00\x01"), "UNSUBSCRIBE without a topic filter"),
        (connect(0xC3), "reserved flag"),
        (connect(0xC2, name=b"MQIsdp"), "protocol name b'MQIsdp' at level 4"),
        (connect(0x1E, field("d") + field("t") + field("m")), "will QoS 3"),
        (connect(0x06, field("d") + field("a/#") + field("m")), "will topic is not"),
        (connect(0x22), "will QoS or retain without a will"),
        (connect(0x0A), "will QoS or retain without a will"),
        (connect(0x42, field("d") + field("pw")), "password without a user name"),
        (connect(0xC2, field("d") + field("u")), "ends inside its password"),
        (connect(0x02, field("d") + b"!"), "CONNECT has bytes after its fields"),
    ],
)
def test_malformed_input_is_one_clear_error(data: bytes, why: str) -> None:
    """Each way a client's bytes can be wrong raises MalformedPacket naming it."""
    with pytest.raises(MalformedPacket, match=why.replace("+", r"\+").replace("(", r"\(")):
        read(data)


def test_hostile_bytes_raise_only_malformed_packet() -> None:
    """Random and mutated streams either parse or raise MalformedPacket: nothing else."""
    rng = random.Random(29)
    good = connect() + packet(0x32, field("t/up") + b"\x00\x05q") + b"\xc0\x00"
    for n in range(3000):
        if n % 2:
            data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
        else:
            mutated = bytearray(good)
            for _ in range(rng.randrange(1, 4)):
                mutated[rng.randrange(len(mutated))] = rng.randrange(256)
            data = bytes(mutated)
        reader = MqttReader(LIMIT)
        try:
            for start in range(0, len(data), 7):
                reader.feed(data[start : start + 7])
        except MalformedPacket:
            pass


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        ("a/b", True),
        ("+/b/#", True),
        ("#", True),
        ("/", True),
        ("", False),
        ("a/#/b", False),
        ("a#", False),
        ("a/b+", False),
    ],  # fmt: skip
)
def test_topic_filters_put_wildcards_on_whole_levels(text: str, valid: bool) -> None:
    """§4.7.1: + is one whole level; # is the whole last level."""
    assert check_filter(text) is valid
