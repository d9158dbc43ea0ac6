"""A whole WebSocket handshake request read once, into the ``Request`` websockets would make.

``DirectUpgrade`` (upgrade.py) has the handshake's bytes whole in one packet. Handed over as
bytes, websockets' ``ServerProtocol`` parses them again, line by line through generators: about
a tenth of a device's join. ``handshake_request`` reads them in one pass into the same
``Request``, passing exactly the checks ``Request.parse`` makes (its limits and patterns are
websockets' own, imported). A request that would fail any of them is not read here (None): it
goes to websockets as bytes, which answers it as it always did (400, 414, 431).
"""

from __future__ import annotations

from websockets.datastructures import Headers
from websockets.http11 import (
    MAX_LINE_LENGTH,
    MAX_NUM_HEADERS,
    Request,
    _token_re,
    _value_re,
)

__all__ = ["handshake_request"]

_PROTOCOLS = (b"HTTP/1.1", b"HTTP/1.0")  # what Request.parse accepts


def handshake_request(data: bytes) -> Request | None:
    """The ``Request`` websockets' parser makes of ``data`` (one whole request, its head and
    nothing after), or None if that parser would not accept it (or not in one piece)."""
    if b"\n" in data.replace(b"\r\n", b""):
        return None  # a bare LF ends a line for websockets, not for this split: let it decide
    lines = data.split(b"\r\n")
    if len(lines) < 3 or lines[-1] or lines[-2]:
        return None  # not one head ended by an empty line
    del lines[-2:]
    if len(lines) - 1 > MAX_NUM_HEADERS or any(len(line) + 2 > MAX_LINE_LENGTH for line in lines):
        return None  # over websockets' limits: it answers 414 or 431
    parts = lines[0].split(b" ", 2)
    if len(parts) != 3 or parts[2] not in _PROTOCOLS:
        return None
    try:
        method, path = parts[0].decode("ascii"), parts[1].decode("ascii")
    except UnicodeDecodeError:
        return None
    headers = Headers()
    for index in range(1, len(lines)):
        raw_name, colon, raw_value = lines[index].partition(b":")
        raw_value = raw_value.strip(b" \t")
        if not colon or not _token_re.fullmatch(raw_name) or not _value_re.fullmatch(raw_value):
            return None
        headers.set_insecure(raw_name.decode("ascii"), raw_value.decode("iso-8859-1"))
    if "Transfer-Encoding" in headers or not set(headers.get_all("Content-Length")) <= {"0"}:
        return None
    return Request(path, headers, method, parts[2].decode("ascii"))
