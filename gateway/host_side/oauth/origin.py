"""Where a request came from and which URL it reached: the issuer, the resource, the peer.

The issuer, and so the protected resource, is the URL the request came in on (its Host header,
which the Host/Origin guard has checked) when that is one of the gateway's own names: ``[host]
remote_url``, loopback, the address the request's socket reached (a LAN address of this machine)
and the names in ``[host] allowed_hosts``. Any other name is answered with ``[host] remote_url``
when one is set. So an app is told the very URL its user typed, as Home Assistant requires
(character for character), and one on the LAN and one through the owner's tunnel work at once;
each token is bound to the resource it was issued for (``site.verify``). A request from
a configured trusted proxy may name its scheme, host and client in ``X-Forwarded-Proto``,
``X-Forwarded-Host`` and ``X-Forwarded-For``; anyone else's forwarded headers are ignored.

Tokens go out only over HTTPS, or over plain HTTP from loopback and the private networks the owner
lists (``[oauth] http_networks``), where the static host token travels the same way today.
"""

from __future__ import annotations

import fnmatch
import urllib.parse
from contextvars import ContextVar
from dataclasses import dataclass

from starlette.requests import HTTPConnection

from gateway.config import Config, is_loopback_host
from gateway.net.networks import Network, in_networks, networks
from gateway.net.peer import socket_peer

__all__ = ["CURRENT", "MCP_PATH", "Origin", "OriginRules"]

MCP_PATH = "/mcp"
_LOOPBACK = networks(("127.0.0.0/8", "::1"))
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_FORWARDED = ("x-forwarded-for", "x-forwarded-proto", "x-forwarded-host", "forwarded")


@dataclass(frozen=True, slots=True)
class Origin:
    """One request's issuer (``scheme://host[:port]``), client address and right to tokens."""

    issuer: str
    address: str
    may_issue: bool
    https: bool = False  # the browser's own connection was HTTPS (to us, or to a trusted proxy)

    @property
    def resource(self) -> str:
        """The protected resource: the MCP endpoint (RFC 8707, RFC 9728)."""
        return self.issuer + MCP_PATH

    @property
    def resource_metadata(self) -> str:
        """The RFC 9728 metadata URL of the resource (its path form)."""
        return f"{self.issuer}/.well-known/oauth-protected-resource{MCP_PATH}"


# The origin of the OAuth request being handled (set by the routes' wrapper for the provider,
# whose SDK-defined methods do not see the request).
CURRENT: ContextVar[Origin] = ContextVar("oauth_origin")


class OriginRules:
    """The config's answer to "which issuer, and may this request get a token"."""

    def __init__(self, config: Config) -> None:
        self.public_url = config.host_public_url
        self._public_name = urllib.parse.urlsplit(self.public_url or "").hostname
        # allowed_hosts are Host patterns (``name``, ``name:*``, ``*.example.com``): names here
        self._names = tuple(
            pattern.lower().removesuffix(":*")
            for pattern in (*_LOOPBACK_NAMES, *config.host_allowed_hosts)
        )
        self._proxies: tuple[Network, ...] = networks(config.host_trusted_proxies)
        self._http: tuple[Network, ...] = _LOOPBACK + networks(config.oauth_http_networks)

    def of(self, conn: HTTPConnection) -> Origin:
        """The origin of ``conn``."""
        peer = conn.client.host if conn.client else ""
        headers = conn.headers
        scheme, host, address = conn.url.scheme, headers.get("host", ""), peer
        # Which proxy to believe: the socket's address (X-Forwarded-For is anyone's to write).
        if self._proxies and in_networks(socket_peer(conn), self._proxies):
            scheme = _first(headers.get("x-forwarded-proto")) or scheme
            host = _first(headers.get("x-forwarded-host")) or host
            address = _last(headers.get("x-forwarded-for")) or peer
        if scheme not in ("http", "https"):
            scheme = "http"
        name = urllib.parse.urlsplit(f"//{host}").hostname or ""
        reached = f"{scheme}://{host}"
        # A proxy that rewrote the Host to this machine's loopback (nginx's default) speaks for
        # the public name; an app on this machine sends no X-Forwarded-* of its own.
        proxied = is_loopback_host(name) and any(h in headers for h in _FORWARDED)
        own = not proxied and self._own_name(name, conn)
        if self.public_url and (name == self._public_name or not own):
            issuer = self.public_url  # a tunnel passes the public name over plain HTTP
        else:
            issuer = reached
        secure = issuer.startswith("https://")
        may_issue = secure or in_networks(address, self._http)  # the client, not its proxy
        # The browser came over HTTPS when the issuer is https: a tunnel may pass the public name
        # over plain HTTP, with no forwarded headers.
        return Origin(issuer, address, may_issue, https=secure)

    def _own_name(self, name: str, conn: HTTPConnection) -> bool:
        """True when the host ``name`` names this gateway: loopback, an allowed host, or the
        very address the request's socket reached (one of this machine's addresses)."""
        server = conn.scope.get("server")
        if server and name == str(server[0]).strip("[]"):
            return True
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self._names)


def _first(value: str | None) -> str | None:
    return value.split(",")[0].strip() or None if value else None


def _last(value: str | None) -> str | None:
    """The address the trusted proxy itself saw (the last hop it appended)."""
    return value.split(",")[-1].strip() or None if value else None
