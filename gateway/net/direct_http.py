"""Small POSTs answered straight from the socket's bytes: no h11, no ASGI scope, no task.

A stock device checks in at the OTA endpoint once per boot: one small POST, one JSON reply. On
uvicorn's path that is an ``h11.Connection`` parsing the request, an ASGI scope and a task for
it, Starlette's middleware and router, and h11 again writing the reply: about twice what the
gateway's own handling of the check-in costs. ``direct_post`` recognises
such a request when its head arrives whole in a connection's first packet (its body in the
same packet or in the next ones: firmware may write the two apart), for a listener that serves
its target directly (``DirectRequests``); ``response_bytes`` writes the reply as uvicorn
and h11 would have written it, byte for byte. Anything out of the ordinary (a head in
pieces, bytes after the body, chunked, ``Expect``, ``Upgrade``, proxy headers, another
method, target or HTTP version, a head or body past its limit, a header line h11 might read
otherwise) is left to uvicorn's h11 path, which answers it as it always did.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Protocol

__all__ = ["DirectPost", "DirectRequests", "Reply", "direct_post", "response_bytes"]

_END = b"\r\n\r\n"
# uvicorn's reason phrases (its h11 path's ``STATUS_PHRASES``): the standard library's, none for
# a code it does not know.
_PHRASES = {status.value: status.phrase.encode() for status in HTTPStatus}
MAX_HEAD = 8 * 1024  # a stock check-in's head is about 300 bytes; h11 refuses past 16 KiB
# RFC 9110 §5.1 and §5.5 as h11 checks them (token names; visible characters, spaces and
# tabs inside a value): a line outside them goes to h11, which answers its 400.
_NAME = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
_VALUE = re.compile(rb"(?:[\x21-\x7e\x80-\xff](?:[ \t\x21-\x7e\x80-\xff]*[\x21-\x7e\x80-\xff])?)?")
# Headers that change how uvicorn, h11 or its proxy-headers middleware treat a request: such
# a request takes their path.
_THEIRS = frozenset(
    (b"transfer-encoding", b"expect", b"upgrade", b"x-forwarded-for", b"x-forwarded-proto")
)


@dataclass(frozen=True, slots=True)
class DirectPost:
    """One ``POST`` to a directly served target, its head whole (its body perhaps not yet)."""

    target: bytes
    headers: dict[str, str]  # lower-case names, the first of repeated ones (as Starlette's get)
    body: bytes  # what came of it so far
    length: int  # Content-Length
    keep_alive: bool  # no ``Connection: close``

    @property
    def whole(self) -> bool:
        """Has the whole body come?"""
        return len(self.body) == self.length


class Reply(Protocol):
    """What a direct handler answers: the parts of a Starlette ``Response`` uvicorn sends (one
    with no background task: nothing would run it here)."""

    @property
    def status_code(self) -> int: ...

    @property
    def raw_headers(self) -> Sequence[tuple[bytes, bytes]]: ...

    @property
    def body(self) -> bytes | memoryview: ...


class DirectRequests(Protocol):
    """``POST`` targets a listener answers below ASGI, and their handler."""

    targets: frozenset[bytes]  # request targets exactly as sent (path and query)
    max_body: int  # larger bodies take the ASGI path (and its 413)

    def answer(self, post: DirectPost, client: str | None) -> Reply:
        """The reply to ``post`` from the peer address ``client`` (what the ASGI route answers
        the same request)."""
        ...


def direct_post(data: bytes, requests: DirectRequests) -> DirectPost | None:
    """``data`` as a ``DirectPost`` if it is one plain HTTP/1.1 ``POST`` to one of
    ``requests.targets``, its head whole and its body whole or not yet (``DirectPost.whole``),
    nothing after it; else None (h11 reads it)."""
    if not data.startswith(b"POST "):
        return None
    end = data.find(_END)
    if end < 0 or end > MAX_HEAD:
        return None
    lines = data[:end].split(b"\r\n")
    start = lines[0].split(b" ")
    if len(start) != 3 or start[2] != b"HTTP/1.1" or start[1] not in requests.targets:
        return None
    headers: dict[str, str] = {}
    length: int | None = None
    host, keep_alive = False, True
    for index in range(1, len(lines)):
        name, colon, value = lines[index].partition(b":")
        value = value.strip(b" \t")
        if not colon or not _NAME.fullmatch(name) or not _VALUE.fullmatch(value):
            return None
        name = name.lower()
        if name in _THEIRS:
            return None
        if name == b"content-length":
            if length is not None or not value.isdigit():
                return None
            length = int(value)
        elif name == b"host":
            if host:
                return None  # h11 refuses a second Host
            host = True
        elif name == b"connection":
            if b"close" in (token.strip().lower() for token in value.split(b",")):
                keep_alive = False
        headers.setdefault(name.decode("latin-1"), value.decode("latin-1"))
    body = data[end + len(_END) :]
    if not host or length is None or length > requests.max_body or len(body) > length:
        return None  # no Host (h11's 400), a body too long, or pipelined bytes
    return DirectPost(start[1], headers, body, length, keep_alive)


def response_bytes(
    reply: Reply, server_headers: Sequence[tuple[bytes, bytes]], keep_alive: bool
) -> bytes:
    """``reply`` on the wire as uvicorn's h11 path writes it: the status line with uvicorn's
    reason phrase, the server's own headers (``date``, ``server``) first, and h11's
    ``Connection: close`` last when the request asked to close."""
    out: list[bytes | memoryview] = [
        b"HTTP/1.1 %d %s\r\n" % (reply.status_code, _PHRASES.get(reply.status_code, b""))
    ]
    for name, value in (*server_headers, *reply.raw_headers):
        out += [name, b": ", value, b"\r\n"]
    if not keep_alive:
        out.append(b"Connection: close\r\n")
    out.append(b"\r\n")
    out.append(reply.body)
    return b"".join(out)
