"""websockets' private names and internals: its header patterns, its frame parser's state.

Checked with websockets 17.4 (pyproject: ``websockets>=17,<18``).

``start_frames`` starts a server connection's frame parser as websockets does once it has read
the handshake request (``Protocol.parse`` in place of ``ServerProtocol.parse``), for a request
the listener read itself.

``TOKEN_RE`` and ``VALUE_RE`` are the patterns websockets' HTTP/1.1 parser checks a header's name
and value with (``websockets.http11._token_re``, ``_value_re``), and ``add_checked_header`` how
it then adds the header (``Headers.set_insecure``, listed under "Internal methods"):
``net/handshake_request.py`` reads a device's handshake in one pass, accepting exactly what
websockets would.

A WebSocket's plain text frames read and written without websockets' frame machinery.

A device call is one text frame each way. Through websockets' sans-I/O ``Protocol`` each pays
for the general case: the incoming one is fed to a stream reader and parsed by a generator that
reads the header, length, mask and payload in four steps, makes a ``Frame``, checks it and
queues it as an event; the outgoing one becomes a ``Frame``, is serialised through a buffer and
queued for ``data_to_send()``. The common case takes a few slices instead: a whole, final,
unfragmented text frame that is all of what arrived, on an open connection with no extension,
no fragmented message in progress and nothing else buffered. Anything else goes through
websockets as before, so control frames, fragments, compression, limits and every error keep
websockets' handling; ``frame_text`` answers ``None`` for those, never raises.

The server side only: what a client sends must be masked (RFC 6455 5.3), what the server sends
must not be.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable

from websockets.datastructures import Headers
from websockets.http11 import _token_re, _value_re
from websockets.protocol import OPEN, Protocol
from websockets.server import ServerProtocol
from websockets.streams import StreamReader

try:  # websockets' C mask, as its own frames use when it was built with it
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - a websockets without its C extension
    from websockets.utils import apply_mask

__all__ = [
    "TOKEN_RE",
    "VALUE_RE",
    "add_checked_header",
    "frame_text",
    "start_frames",
    "text_frame",
    "writes_plainly",
]

TOKEN_RE: re.Pattern[bytes] = _token_re
"""A header name, as websockets' parser takes it (RFC 9110 5.1 ``token``)."""
VALUE_RE: re.Pattern[bytes] = _value_re
"""A header value, as websockets' parser takes it (RFC 9110 5.5 ``field-value``, obs-text too)."""
add_checked_header: Callable[[Headers, str, str], None] = Headers.set_insecure
"""Add a header whose value ``VALUE_RE`` matched, not checking it again (``headers[name] = value``
would), as websockets' own parser does."""

_TEXT = 0x81  # FIN, no RSV bit, opcode 1 (RFC 6455 5.2)
_MASKED = 0x80
_SHORT, _MEDIUM = 126, 127  # the 7-bit length's markers of a 16-bit and a 64-bit length
# Where websockets' parser waits between frames (``Protocol.parse``: ``reader.at_eof()``).
# Anywhere else it may have taken a frame's header and wait for its payload with an empty
# buffer, as when a device writes the header and the payload apart (esp_websocket_client does):
# the payload's bytes are not a frame, whatever they look like.
_BETWEEN_FRAMES = StreamReader.at_eof.__code__


def start_frames(conn: ServerProtocol) -> None:
    """Skip ``conn``'s handshake parse: its parser reads frames from now on (``conn.parser``,
    as ``ServerProtocol.parse`` goes on to ``Protocol.parse`` once it has read the request)."""
    conn.parser = Protocol.parse(conn)
    next(conn.parser)


def _plain(conn: Protocol) -> bool:
    """Nothing about ``conn`` needs websockets' own handling of a text frame."""
    return conn.state is OPEN and not conn.extensions and not conn.debug


def frame_text(conn: Protocol, data: bytes) -> bytes | None:
    """The payload of the one whole text frame ``data`` is, unmasked; None when websockets
    must read ``data`` (not such a frame, or the connection is not at a plain frame boundary).
    """
    size = len(data)
    if size < 6 or data[0] != _TEXT or not _plain(conn):
        return None
    if conn.current_size is not None or conn.reader.buffer or conn.max_fragment_size is not None:
        return None
    waiting = getattr(conn.parser, "gi_yieldfrom", None)
    if getattr(waiting, "gi_code", None) is not _BETWEEN_FRAMES:
        return None
    length = data[1] ^ _MASKED  # 126 or more (not <126) when the mask bit is missing
    start = 6
    if length == _SHORT:
        if size < 8:
            return None
        length, start = (data[2] << 8) | data[3], 8
    elif length >= _SHORT:
        return None  # a 64-bit length, or no mask: websockets decides
    if start + length != size:
        return None
    limit = conn.max_message_size
    if limit is not None and length > limit:
        return None  # websockets closes with 1009
    return apply_mask(data[start:], data[start - 4 : start])


def writes_plainly(conn: Protocol) -> bool:
    """Whether a text frame may go out as ``text_frame`` makes it: the connection open, with no
    extension, no fragmented message of ours in progress and nothing queued before it."""
    return _plain(conn) and not conn.expect_continuation_frame and not conn.writes


def text_frame(payload: bytes) -> bytes:
    """A server's whole text frame carrying ``payload`` (UTF-8)."""
    size = len(payload)
    if size < _SHORT:
        return bytes((_TEXT, size)) + payload
    if size < 1 << 16:
        return struct.pack("!BBH", _TEXT, _SHORT, size) + payload
    return struct.pack("!BBQ", _TEXT, _MEDIUM, size) + payload
