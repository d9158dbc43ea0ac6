"""A whole WebSocket handshake request read once, into the ``Request`` websockets would make.

``DirectUpgrade`` (upgrade.py) has the handshake's bytes whole in one packet. Handed over as
bytes, websockets' ``ServerProtocol`` parses them again, line by line through generators: about
a tenth of a device's join. ``handshake_request`` reads them in one pass into the same
``Request``, passing exactly the checks ``Request.parse`` makes (its limits and patterns are
websockets' own, the patterns through ``gateway.compat.websockets``). A request that would fail
any of them is not read here (None): it goes to websockets as bytes, which answers it as it
always did (400, 414, 431). Its checks are those of websockets 17, the oldest release the
gateway installs with (15 and 16 check the request line otherwise);
tests/net/test_handshake_request.py compares the two on any input.
"""

from __future__ import annotations

import re

from websockets.datastructures import Headers
from websockets.http11 import MAX_LINE_LENGTH, MAX_NUM_HEADERS, Request

from gateway.compat.websockets import TOKEN_RE, VALUE_RE, add_checked_header

__all__ = ["handshake_request"]

_PROTOCOLS = (b"HTTP/1.1", b"HTTP/1.0")  # what Request.parse accepts
# Every header line as parse_headers accepts it, the empty line after the last: checked in one
# match, from websockets' own patterns. Neither pattern takes CR or LF, so the lines are the
# lines websockets would read (a bare LF fails the match), and a value matches its pattern
# stripped of spaces and tabs exactly when it does unstripped (its pattern takes both).
_HEADERS = re.compile(b"(?:%s:%s\r\n)*\r\n" % (TOKEN_RE.pattern, VALUE_RE.pattern))


def handshake_request(data: bytes) -> Request | None:
    """The ``Request`` websockets' parser makes of ``data`` (one whole request, its head and
    nothing after), or None if that parser would not accept it (or not in one piece)."""
    line_end = data.find(b"\r\n")
    if not 0 < line_end <= MAX_LINE_LENGTH - 2 or not _HEADERS.fullmatch(data, line_end + 2):
        return None
    lines = data[line_end + 2 : -2].split(b"\r\n")[:-1]  # each ended by CRLF
    if len(lines) > MAX_NUM_HEADERS or max(map(len, lines), default=0) + 2 > MAX_LINE_LENGTH:
        return None  # over websockets' limits: it answers 414 or 431
    parts = data[:line_end].split(b" ", 2)
    if len(parts) != 3 or parts[2] not in _PROTOCOLS or b"\n" in data[:line_end]:
        return None
    try:
        method, path = parts[0].decode("ascii"), parts[1].decode("ascii")
    except UnicodeDecodeError:
        return None
    headers = Headers()
    for line in lines:
        name, _, value = line.partition(b":")
        add_checked_header(headers, name.decode("ascii"), value.strip(b" \t").decode("iso-8859-1"))
    if "Transfer-Encoding" in headers or not set(headers.get_all("Content-Length")) <= {"0"}:
        return None
    return Request(path, headers, method, parts[2].decode("ascii"))
