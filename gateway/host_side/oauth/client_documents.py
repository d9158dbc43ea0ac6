"""Client ID metadata documents: an app whose ``client_id`` is an https URL describes itself there.

The gateway fetches that URL on the app's behalf, so the fetch is what a hostile app would aim at
the owner's network: only https, only public addresses (the voice proxy's rules,
``gateway.net.destinations``: resolved once, checked after resolution, and the request sent to the
address checked; private addresses refused too; ``[oauth] metadata_networks`` may add others),
at most ``MAX_BYTES``,
``TIMEOUT`` seconds in all, ``MAX_REDIRECTS`` redirects, each checked again. The document must
name the very URL it came from as its ``client_id``. A document that passed is kept for
``CACHE_SECONDS``.
"""

from __future__ import annotations

import ipaddress
import json
import time
import urllib.parse
from collections import OrderedDict
from typing import Any

import anyio
import httpx2
from mcp.shared.auth import OAuthClientInformationFull
from pydantic import ValidationError

from gateway.host_side.oauth.redirects import redirect_refusal
from gateway.net.addresses import host_port
from gateway.net.destinations import (
    LINK_LOCAL,
    THIS_MACHINE,
    DestinationRefused,
    address_reach,
    resolve_destination,
)
from gateway.net.networks import Network, in_networks

__all__ = ["ClientDocumentError", "ClientDocuments", "is_document_id"]

MAX_BYTES = 16 * 1024
TIMEOUT = 5.0
MAX_REDIRECTS = 3
CACHE_SECONDS = 300.0
_MAX_CACHED = 256


class ClientDocumentError(Exception):
    """The client's metadata document cannot be used; the message says why."""


def is_document_id(client_id: str) -> bool:
    """True for a client id that names a metadata document (an https URL)."""
    return client_id.startswith("https://")


class ClientDocuments:
    """Fetch, check and cache client metadata documents."""

    def __init__(self, allowed: tuple[Network, ...] = (), timeout: float = TIMEOUT) -> None:
        self._allowed = allowed
        self.timeout = timeout
        self._cache: OrderedDict[str, tuple[float, OAuthClientInformationFull]] = OrderedDict()

    def cached(self, url: str) -> OAuthClientInformationFull | None:
        """The document fetched for ``url`` lately, if any."""
        found = self._cache.get(url)
        if found is None or found[0] < time.monotonic():
            return None
        return found[1]

    async def get(self, url: str) -> OAuthClientInformationFull:
        """The app described at ``url``.

        Raises:
            ClientDocumentError: the URL or the document is unusable, or the fetch failed.
        """
        found = self.cached(url)
        if found is not None:
            return found
        _check_url(url)
        try:
            with anyio.fail_after(self.timeout):
                body = await self._fetch(url)
        except (TimeoutError, httpx2.TimeoutException):
            raise ClientDocumentError(f"{url} did not answer within {self.timeout:g} s") from None
        except httpx2.HTTPError as exc:  # refused, TLS not trusted, broken answer...
            raise ClientDocumentError(f"{url} could not be fetched: {exc}") from None
        client = _parse(url, body)
        self._cache[url] = (time.monotonic() + CACHE_SECONDS, client)
        while len(self._cache) > _MAX_CACHED:
            self._cache.popitem(last=False)
        return client

    async def _fetch(self, url: str) -> bytes:
        async with httpx2.AsyncClient(follow_redirects=False, timeout=self.timeout) as http:
            for _ in range(MAX_REDIRECTS + 1):
                r = await http.send(await self._pinned(http, url), stream=True)
                try:
                    if r.is_redirect and "location" in r.headers:
                        url = urllib.parse.urljoin(url, r.headers["location"])
                        _check_url(url)
                        continue
                    return await _body(url, r)
                finally:
                    await r.aclose()
        raise ClientDocumentError(f"{url}: more than {MAX_REDIRECTS} redirects")

    async def _pinned(self, http: httpx2.AsyncClient, url: str) -> httpx2.Request:
        """A GET of ``url`` sent to the address checked, never to a second DNS answer (the
        TLS handshake and the Host header still name the host)."""
        parts = urllib.parse.urlsplit(url)
        address = await self.checked_address(parts.hostname or "", parts.port or 443)
        pinned = parts._replace(netloc=host_port(address, parts.port or 443))
        return http.build_request(
            "GET", urllib.parse.urlunsplit(pinned),
            headers={"Accept": "application/json", "Host": parts.netloc},
            extensions={"sni_hostname": parts.hostname},
        )  # fmt: skip

    async def checked_address(self, host: str, port: int) -> str:
        """The address to fetch from: the voice proxy's rules (gateway/net/destinations.py:
        never this machine or the link-local network, checked after resolution), and no
        private address either; ``[oauth] metadata_networks`` lets listed ones through.

        Raises:
            ClientDocumentError: ``host`` does not resolve, or leads where it must not.
        """
        try:
            destination = await resolve_destination(host, port, allow=(THIS_MACHINE, LINK_LOCAL))
        except DestinationRefused as exc:
            raise ClientDocumentError(str(exc)) from None
        if in_networks(destination.address, self._allowed):
            return destination.address
        place = address_reach(destination.address)
        if place is None and not ipaddress.ip_address(destination.address.split("%")[0]).is_global:
            place = "a private address"
        if place is not None:
            raise ClientDocumentError(f"{host} leads to {place} ({destination.address})")
        return destination.address


async def _body(url: str, response: httpx2.Response) -> bytes:
    """The document, read up to ``MAX_BYTES``."""
    if response.status_code != 200:
        raise ClientDocumentError(f"{url} answered HTTP {response.status_code}")
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > MAX_BYTES:
            raise ClientDocumentError(f"{url}: the document is larger than {MAX_BYTES} bytes")
    return bytes(body)


def _check_url(url: str) -> None:
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises on a port out of range
    except ValueError:
        raise ClientDocumentError(f"client_id {url!r} is not a URL") from None
    if len(url) > 2048 or parts.scheme != "https" or not parts.hostname:
        raise ClientDocumentError(f"client_id {url!r} must be an https URL")
    if parts.path in ("", "/") or parts.fragment or parts.username or parts.password:
        raise ClientDocumentError(
            f"client_id {url!r} must have a path and no fragment or credentials"
        )


def _parse(url: str, body: bytes) -> OAuthClientInformationFull:
    try:
        document: Any = json.loads(body)
    except ValueError:
        raise ClientDocumentError(f"{url}: the document is not JSON") from None
    if not isinstance(document, dict):
        raise ClientDocumentError(f"{url}: the document is not a JSON object")
    if document.get("client_id") != url:
        raise ClientDocumentError(
            f"{url}: the document's client_id {document.get('client_id')!r} is not its own URL"
        )
    if document.get("token_endpoint_auth_method", "none") != "none":
        raise ClientDocumentError(f"{url}: only public clients (auth method none) are supported")
    for uri in document.get("redirect_uris") or ():
        refusal = redirect_refusal(uri) if isinstance(uri, str) else f"{uri!r} is not a URL"
        if refusal is not None:
            raise ClientDocumentError(f"{url}: {refusal}")
    document = {
        key: document[key]
        for key in ("client_id", "client_name", "client_uri", "logo_uri", "redirect_uris")
        if key in document
    }
    try:
        return OAuthClientInformationFull.model_validate(
            {
                **document,
                "token_endpoint_auth_method": "none",
                "grant_types": ["authorization_code", "refresh_token"],
                "response_types": ["code"],
            }
        )
    except ValidationError as exc:
        raise ClientDocumentError(f"{url}: {exc.errors()[0]['msg']}") from None
