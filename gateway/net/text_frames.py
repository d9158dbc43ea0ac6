"""Where a device WebSocket's frames begin, from the bytes we feed websockets; plain text frames.

A device call is one text frame each way. Through websockets' sans-I/O ``ServerProtocol`` each
pays for the general case: the incoming one is fed to a stream reader and parsed by a generator
in four steps (header, length, mask, payload), made a ``Frame``, checked and queued as an event;
the outgoing one becomes a ``Frame``, is serialised through a buffer and queued for
``data_to_send()``. The common case takes a few slices instead: ``whole_text_frame`` reads one
whole, final, masked text frame, and ``text_frame`` writes one.

Reading one in place is right only where websockets' parser would read those bytes as a new
frame: between two frames, with no fragmented message in progress. ``FrameBoundary`` knows
that from the bytes themselves (RFC 6455 5.2): fed every byte the socket hands websockets'
``receive_data``, it reads each frame's header (FIN, opcode, mask, 7-, 16- or 64-bit length)
and counts off its payload, so it knows how much of the current frame is still to come and
whether a message's fragments are. A device that writes a frame's header and its payload apart
(esp_websocket_client does) sends a packet of payload alone: whatever it looks like, it is no
frame, and ``FrameBoundary`` says so. It checks nothing: what a frame breaks (no mask, an RSV
bit, a bad opcode, a size over the limit) websockets finds and fails, and from then on the
connection is not open, so nothing is read in place again.

The server side only: what a client sends must be masked (RFC 6455 5.3), what the server sends
must not be.
"""

from __future__ import annotations

import struct

__all__ = ["FrameBoundary", "text_frame", "unmask", "whole_text_frame"]

_TEXT = 0x81  # FIN, no RSV bit, opcode 1 (RFC 6455 5.2)
_FIN = 0x80
_MASKED = 0x80
_OPCODE = 0x0F
_CONTROL = 0x8  # opcodes from 8 up: close, ping, pong (never fragmented, may come between)
_SHORT, _LONG = 126, 127  # the 7-bit length's markers of a 16-bit and a 64-bit length
_HEAD_END = b"\r\n\r\n"  # the handshake request's end (RFC 9112 2.1: its empty line)


class FrameBoundary:
    """Where the next byte fed to a server connection falls: in its handshake request, in a
    frame (its header or its payload), or at the start of a frame; and whether a fragmented
    message is in progress.

    Fed each chunk in the order websockets' ``receive_data`` gets it, from the connection's
    first byte on.
    """

    __slots__ = ("_head", "_remaining", "fragmented", "handshake")

    def __init__(self) -> None:
        self.handshake = True  # still in the request (its bytes so far end with ``_head``)
        self._head = b""  # a frame header begun (or the request's last bytes), not yet whole
        self._remaining = 0  # payload bytes of the current frame still to come
        self.fragmented = False  # a data message's first fragment came, its last not yet

    @property
    def between_messages(self) -> bool:
        """The next byte starts a frame, and no message is in progress: a new message's first
        frame may come."""
        return not (self.handshake or self._head or self._remaining or self.fragmented)

    def feed(self, data: bytes) -> None:
        """Account for ``data``, the next bytes of the connection."""
        if self.handshake:
            data = self._past_request(data)
        size, at = len(data), 0
        while at < size:
            if self._remaining:
                taken = min(self._remaining, size - at)
                self._remaining -= taken
                at += taken
                continue
            head = self._head + data[at : at + 14]  # a header is 2 to 14 bytes
            length = _header_length(head)
            if length is None:  # not whole yet: kept until the next bytes come
                self._head = head
                return
            at += length - len(self._head)
            self._head = b""
            self._frame(head)

    def _past_request(self, data: bytes) -> bytes:
        """What of ``data`` comes after the handshake request (nothing while it goes on)."""
        seen = self._head + data
        end = seen.find(_HEAD_END)
        if end < 0:
            self._head = seen[-3:]  # an end split across packets is found next time
            return b""
        self.handshake, self._head = False, b""
        return seen[end + len(_HEAD_END) :]

    def _frame(self, head: bytes) -> None:
        first, second = head[0], head[1]
        length = second & 0x7F
        if length == _SHORT:
            (length,) = struct.unpack_from("!H", head, 2)
        elif length == _LONG:
            (length,) = struct.unpack_from("!Q", head, 2)
        self._remaining = length
        opcode = first & _OPCODE
        if opcode < _CONTROL:  # a data frame: it starts, goes on or ends a message
            self.fragmented = not first & _FIN


def _header_length(head: bytes) -> int | None:
    """How long the frame header ``head`` starts with is, or None if ``head`` does not hold
    all of it."""
    if len(head) < 2:
        return None
    length = head[1] & 0x7F
    need = 2 + (2 if length == _SHORT else 8 if length == _LONG else 0)
    if head[1] & _MASKED:
        need += 4
    return need if len(head) >= need else None


def unmask(payload: bytes, mask: bytes) -> bytes:
    """``payload`` XORed with the 4-byte ``mask`` repeated (RFC 6455 5.3)."""
    size = len(payload)
    if not size:
        return b""
    key = (mask * (size // 4 + 1))[:size]
    value = int.from_bytes(payload, "little") ^ int.from_bytes(key, "little")
    return value.to_bytes(size, "little")


def whole_text_frame(data: bytes, max_size: int | None) -> bytes | None:
    """The unmasked payload of the one whole, final, masked text frame ``data`` is, with a
    7- or 16-bit length no more than ``max_size``; else None (websockets reads ``data``: not
    such a frame, or one it refuses).

    Only right where a new message may start (``FrameBoundary.between_messages``).
    """
    size = len(data)
    if size < 6 or data[0] != _TEXT:
        return None
    length = data[1] ^ _MASKED  # 126 or more (not <126) when the mask bit is missing
    start = 6
    if length == _SHORT:
        if size < 8:
            return None
        length, start = (data[2] << 8) | data[3], 8
    elif length > _SHORT:
        return None  # a 64-bit length, or no mask: websockets decides
    if start + length != size or (max_size is not None and length > max_size):
        return None  # not all of what came, or over the limit (websockets closes with 1009)
    return unmask(data[start:], data[start - 4 : start])


def text_frame(payload: bytes) -> bytes:
    """A server's whole text frame carrying ``payload`` (UTF-8)."""
    size = len(payload)
    if size < _SHORT:
        return bytes((_TEXT, size)) + payload
    if size < 1 << 16:
        return struct.pack("!BBH", _TEXT, _SHORT, size) + payload
    return struct.pack("!BBQ", _TEXT, _LONG, size) + payload
