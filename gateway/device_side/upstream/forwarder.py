"""``OtaForwarder``: a proxied device's OTA check-in and activation, asked of its voice server.

The device's own request goes upstream with its own headers and body (docs/protocol.md §8.1):
the upstream binds what it answers (the WebSocket token, the MQTT login, the activation code)
to ``Device-Id`` and ``Client-Id``, so the gateway adds nothing and leaves nothing out that the
firmware sent. What comes back is bounded and checked here; whatever goes wrong becomes an
``UpstreamUnavailable`` that says why in one sentence, and the OTA endpoint turns it into a
reply the device retries (5xx), never into settings of the gateway's making.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx2

from gateway.net.destinations import Destination

__all__ = ["FORWARDED_HEADERS", "OtaForwarder", "Passed", "UpstreamUnavailable", "activate_url"]

FORWARDED_HEADERS = (
    "Device-Id",
    "Client-Id",
    "Activation-Version",
    "Serial-Number",
    "User-Agent",
    "Accept-Language",
    "Content-Type",
)
"""What stock firmware sends with its OTA requests (docs/protocol.md §3), forwarded as is."""
MAX_REPLY_BYTES = 64 * 1024  # xiaozhi.me answers about 1 KB; more is not an OTA reply


class UpstreamUnavailable(Exception):
    """The voice server could not be asked, or its answer cannot be used.

    Attributes:
        status: the HTTP status the device gets: 504 when it did not answer in time, else 502.
    """

    def __init__(self, message: str, status: int = 502) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Passed:
    """An upstream reply handed to the device as it came (activation)."""

    status: int
    body: bytes
    content_type: str


def activate_url(ota_url: str) -> str:
    """``<ota_url>activate``, joined as stock firmware joins it."""
    return ota_url + ("activate" if ota_url.endswith("/") else "/activate")


class OtaForwarder:
    """Asks voice servers on behalf of devices; one HTTP client (and its pool) for all."""

    def __init__(
        self, timeout: float, *, transport: httpx2.AsyncBaseTransport | None = None
    ) -> None:
        """Ready to forward; ``timeout`` bounds each request as a whole, in seconds."""
        self._timeout = timeout
        # No redirects: the device would not follow one to another host with its headers either.
        self._client = httpx2.AsyncClient(
            timeout=httpx2.Timeout(None), follow_redirects=False, transport=transport
        )

    async def aclose(self) -> None:
        """Close the pooled connections."""
        await self._client.aclose()

    async def check_in(
        self, ota_url: str, method: str, headers: Mapping[str, str], body: bytes
    ) -> dict[str, Any]:
        """The upstream's OTA reply to the device's check-in, as a JSON object.

        Raises:
            UpstreamUnavailable: unreachable, too slow, not 200, too large, or not a JSON object.
        """
        status, data, _ = await self._send(ota_url, method, _device_headers(headers), body)
        if status != 200:
            raise UpstreamUnavailable(f"it answered HTTP {status}{_excerpt(data)}")
        try:
            reply = json.loads(data)
        except (ValueError, RecursionError):
            raise UpstreamUnavailable(f"its reply is not JSON{_excerpt(data)}") from None
        if not isinstance(reply, dict):
            raise UpstreamUnavailable("its reply is not a JSON object")
        return reply

    async def activate(self, ota_url: str, headers: Mapping[str, str], body: bytes) -> Passed:
        """The upstream's answer to an activation attempt, to hand on unchanged (202, 200...).

        Raises:
            UpstreamUnavailable: unreachable, too slow, or a reply too large.
        """
        url, sent = activate_url(ota_url), _device_headers(headers)
        status, data, content_type = await self._send(url, "POST", sent, body)
        return Passed(status, data, content_type or "application/json")

    async def upload(
        self,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        within: float,
        destination: Destination | None = None,
    ) -> Passed:
        """Hand a camera upload to the upstream's vision URL; its answer, to pass on.

        ``headers`` are sent as they are (the caller picks them: the upstream's token). With
        ``destination``, the connection goes to its checked address (the URL's host is still
        named in ``Host`` and TLS).

        Raises:
            UpstreamUnavailable: unreachable, too slow, or a reply too large.
        """
        status, data, content_type = await self._send(url, "POST", headers, body, within,
                                                      destination)  # fmt: skip
        return Passed(status, data, content_type or "application/json")

    async def _send(
        self,
        url: str,
        method: str,
        headers: Mapping[str, str],
        body: bytes,
        within: float | None = None,
        destination: Destination | None = None,
    ) -> tuple[int, bytes, str | None]:
        seconds = within or self._timeout
        try:
            request = self._client.build_request(method, url, headers=headers, content=body)
            if destination is not None:  # Host was set from the URL: it stays the name
                request.url = request.url.copy_with(host=destination.address)
                request.extensions["sni_hostname"] = destination.host
        except httpx2.InvalidURL as exc:  # a URL the voice server gave (its camera's)
            raise UpstreamUnavailable(f"its URL is unusable ({exc})") from None
        try:
            async with asyncio.timeout(seconds):  # the whole exchange, however it trickles
                response = await self._client.send(request, stream=True)
                try:
                    data = await _read_capped(response)
                finally:
                    await response.aclose()
        except (TimeoutError, httpx2.TimeoutException):
            raise UpstreamUnavailable(f"no answer within {seconds:g} s", 504) from None
        except httpx2.HTTPError as exc:
            raise UpstreamUnavailable(_why(exc)) from None
        return response.status_code, data, response.headers.get("content-type")


def _device_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {name: headers[name] for name in FORWARDED_HEADERS if name in headers}


async def _read_capped(response: httpx2.Response) -> bytes:
    chunks, total = [], 0
    async for chunk in response.aiter_bytes():
        total += len(chunk)
        if total > MAX_REPLY_BYTES:
            raise UpstreamUnavailable(f"its reply is larger than {MAX_REPLY_BYTES // 1024} KiB")
        chunks.append(chunk)
    return b"".join(chunks)


def _why(exc: httpx2.HTTPError) -> str:
    cause = exc.__cause__ or exc.__context__
    detail = str(exc) or (str(cause) if cause else "") or type(exc).__name__
    return f"it cannot be reached ({detail})"


def _excerpt(data: bytes) -> str:
    text = data[:120].decode("utf-8", "replace").strip()
    return f": {text!r}" if text else ""
