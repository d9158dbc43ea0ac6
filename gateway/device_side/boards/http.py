"""The HTTP client of one board: its bearer token, its pinned address, and bounded bodies.

The SDK's transports read a JSON response whole (``aread``) before anything can check its
size, so a board answering with 50 MB would cost 50 MB. Here every response body that is not
an event stream is cut off past ``max_bytes`` with a ``StreamError`` (the SDK turns that into a
JSON-RPC error for the request it answered); an event stream is bounded per event by the SDK
(``max_sse_event_size``), since the stream itself lasts as long as the session.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx2

__all__ = ["BoardHttp", "BodyTooLarge"]

CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 300.0  # an idle event stream stays open; calls are bounded above (call timeout)


class BodyTooLarge(httpx2.StreamError):
    """A board's response body is larger than the gateway accepts."""


class _Bounded(httpx2.AsyncByteStream):
    def __init__(self, stream: httpx2.AsyncByteStream, max_bytes: int) -> None:
        self._stream = stream
        self._max = max_bytes

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._stream:
            seen += len(chunk)
            if seen > self._max:
                raise BodyTooLarge(
                    f"the board's response is larger than {self._max} bytes "
                    "([mcp_boards] max_message_bytes)"
                )
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


class _BoundedTransport(httpx2.AsyncBaseTransport):
    def __init__(self, max_bytes: int) -> None:
        # trust_env off: a proxy from the environment must not carry LAN traffic elsewhere
        self._inner = httpx2.AsyncHTTPTransport(trust_env=False)
        self._max = max_bytes

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        kind = response.headers.get("content-type", "").lower()
        if not kind.startswith("text/event-stream"):
            assert isinstance(response.stream, httpx2.AsyncByteStream)
            response.stream = _Bounded(response.stream, self._max)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


class BoardHttp:
    """Makes the HTTP clients the SDK's transports use for one board (an SDK client factory)."""

    def __init__(self, *, token: str | None, host: str | None, max_bytes: int) -> None:
        self.headers: dict[str, str] = {}
        if host is not None:  # the request goes to the checked address; the board wants its name
            self.headers["Host"] = host
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.max_bytes = max_bytes

    def __call__(
        self,
        headers: dict[str, str] | None = None,
        timeout: httpx2.Timeout | None = None,
        auth: httpx2.Auth | None = None,
    ) -> httpx2.AsyncClient:
        """A new client with this board's headers and bounds."""
        kwargs: dict[str, Any] = {
            "headers": {**(headers or {}), **self.headers},
            "timeout": httpx2.Timeout(CONNECT_TIMEOUT, read=READ_TIMEOUT),
            "transport": _BoundedTransport(self.max_bytes),
            "follow_redirects": False,  # the SDK follows same-origin redirects itself, no other
            "trust_env": False,
        }
        if auth is not None:
            kwargs["auth"] = auth
        return httpx2.AsyncClient(**kwargs)
