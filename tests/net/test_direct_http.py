"""Which first bytes are a direct POST, and its reply as uvicorn's h11 path writes it."""

from __future__ import annotations

import pytest
from starlette.responses import JSONResponse

from gateway.net.direct_http import DirectPost, direct_post, response_bytes


class Targets:
    targets = frozenset((b"/ota/",))
    max_body = 100

    def answer(self, post: DirectPost, client: str | None) -> JSONResponse:
        raise AssertionError("not called")


POST = (
    b"POST /ota/ HTTP/1.1\r\nHost: h\r\nDevice-Id: A\r\nDEVICE-ID: B\r\nContent-Length: 2\r\n\r\n{}"
)


def test_a_whole_post_is_read_with_lower_case_names_and_the_first_of_repeated_headers() -> None:
    post = direct_post(POST, Targets())
    assert post is not None and post.whole and post.keep_alive
    assert (post.target, post.body, post.length) == (b"/ota/", b"{}", 2)
    assert post.headers == {"host": "h", "device-id": "A", "content-length": "2"}
    closing = direct_post(POST.replace(b"Host: h", b"Connection: keep-alive, Close\r\nHost: h"),
                          Targets())  # fmt: skip
    assert closing is not None and not closing.keep_alive


def test_a_body_still_to_come_is_a_post_not_yet_whole() -> None:
    post = direct_post(POST[:-1], Targets())
    assert post is not None and not post.whole and post.body == b"{"


@pytest.mark.parametrize(
    "data",
    [
        POST[:20],  # the head in pieces
        POST + b"G",  # bytes after the body
        POST.replace(b"POST", b"PUT"),
        POST.replace(b"/ota/", b"/ota/x"),
        POST.replace(b"HTTP/1.1", b"HTTP/1.0"),
        POST.replace(b"Host: h\r\n", b""),
        POST.replace(b"Host: h", b"Host: h\r\nHost: i"),
        POST.replace(b"Content-Length: 2", b"Content-Length: +2"),
        POST.replace(b"Content-Length: 2", b"Content-Length: 2\r\nContent-Length: 2"),
        POST.replace(b"Content-Length: 2\r\n", b""),
        POST.replace(b"Content-Length: 2", b"Content-Length: 101"),  # past max_body
        POST.replace(b"Device-Id: A", b"Device Id: A"),
        POST.replace(b"Device-Id: A", b"Device-Id: A\x7f"),
        POST.replace(b"Device-Id: A", b" folded"),
        POST.replace(b"Device-Id: A", b"Expect: 100-continue"),
        POST.replace(b"Device-Id: A", b"Transfer-Encoding: chunked"),
        POST.replace(b"Device-Id: A", b"X-Forwarded-For: 10.0.0.1"),
        POST.replace(b"Device-Id: A", b"Upgrade: h2c"),
        POST.replace(b"Host: h", b"Host: h" + b"x" * 9000),  # a head past MAX_HEAD
    ],
)
def test_anything_else_is_left_to_h11(data: bytes) -> None:
    assert direct_post(data, Targets()) is None


def test_the_reply_comes_after_the_servers_headers_and_closes_when_asked() -> None:
    reply = JSONResponse({"a": 1}, 429, headers={"Retry-After": "3"})
    server = [(b"date", b"D"), (b"server", b"uvicorn")]
    assert response_bytes(reply, server, keep_alive=False) == (
        b"HTTP/1.1 429 Too Many Requests\r\ndate: D\r\nserver: uvicorn\r\nretry-after: 3\r\n"
        b"content-length: 7\r\ncontent-type: application/json\r\nConnection: close\r\n\r\n"
        b'{"a":1}'
    )
    assert b"Connection" not in response_bytes(reply, server, keep_alive=True)
