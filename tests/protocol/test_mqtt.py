"""The server's MQTT packets, byte for byte (MQTT 3.1.1)."""

from __future__ import annotations

import pytest

from gateway.protocol.mqtt import (
    ACCEPTED,
    NOT_AUTHORIZED,
    REFUSED_FILTER,
    connack,
    puback,
    publish,
    remaining_length,
    suback,
    unsuback,
)


@pytest.mark.parametrize(
    ("n", "encoded"),
    [
        (0, b"\x00"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (16_383, b"\xff\x7f"),
        (16_384, b"\x80\x80\x01"),
        (268_435_455, b"\xff\xff\xff\x7f"),
    ],  # fmt: skip
)
def test_remaining_length_follows_the_standards_table(n: int, encoded: bytes) -> None:
    """§2.2.3's examples, from one to four bytes."""
    assert remaining_length(n) == encoded


@pytest.mark.parametrize("n", [-1, 268_435_456])
def test_a_length_no_packet_can_hold_is_refused(n: int) -> None:
    """Past four bytes of seven bits there is no encoding."""
    with pytest.raises(ValueError, match="cannot hold"):
        remaining_length(n)


def test_connack_says_session_present_only_when_accepted() -> None:
    """§3.2.2.2: a refused CONNECT never has a session present."""
    assert connack(ACCEPTED) == b"\x20\x02\x00\x00"
    assert connack(ACCEPTED, session_present=True) == b"\x20\x02\x01\x00"
    assert connack(NOT_AUTHORIZED, session_present=True) == b"\x20\x02\x00\x05"


def test_publish_carries_a_packet_id_only_at_qos_1() -> None:
    """QoS 0 has no packet identifier; QoS 1 and retain set their flags."""
    assert publish("a/b", b"hi") == b"\x30\x07\x00\x03a/bhi"
    assert publish("a/b", b"hi", qos=1, retain=True, packet_id=258) == (
        b"\x33\x09\x00\x03a/b\x01\x02hi"
    )


def test_acks_echo_their_packet_id() -> None:
    """PUBACK, SUBACK (a code per filter) and UNSUBACK."""
    assert puback(7) == b"\x40\x02\x00\x07"
    assert suback(7, [0, REFUSED_FILTER, 1]) == b"\x90\x05\x00\x07\x00\x80\x01"
    assert unsuback(7) == b"\xb0\x02\x00\x07"
