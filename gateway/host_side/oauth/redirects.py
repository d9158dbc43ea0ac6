"""Redirect URIs: which an app may register, and which one an authorization request may use.

A redirect URI is compared exactly, with one exception: RFC 8252 §7.3 has the authorization
server accept any port for a loopback redirect URI, because a native app (Claude Code) listens on
whatever port the system gives it and cannot register that port beforehand. Only an app that
proves PKCE S256 gets that exception (as Home Assistant's own OAuth grants it,
``homeassistant/components/auth/indieauth.py``): another local program listening on another port
may receive the code, but cannot redeem it without the app's verifier. Scheme, host and path still
match exactly (``localhost`` is not ``127.0.0.1``).

Plain-HTTP redirect URIs are allowed on loopback, and on the networks the owner lists in
``[oauth] http_networks`` (where tokens go out over plain HTTP already): Home Assistant without its
``my`` integration returns to ``http://<its LAN address>/auth/external/callback``.
"""

from __future__ import annotations

import ipaddress
import urllib.parse

import anyio
from mcp.shared.auth import OAuthClientInformationFull
from pydantic import AnyUrl

from gateway.net.networks import Network, in_networks

__all__ = ["PkceClient", "loopback_match", "redirect_refusal", "refuse_redirects"]

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]", "::1")
_UNSAFE_SCHEMES = ("javascript", "data", "file", "vbscript", "about", "blob")


def redirect_refusal(
    uri: str, http_networks: tuple[Network, ...] = (), lan_names: frozenset[str] = frozenset()
) -> str | None:
    """Why ``uri`` cannot be a redirect URI (RFC 9700 §4.1, RFC 8252 §7), or None.

    A plain-HTTP URI is allowed on loopback, and on ``http_networks`` when its host is an
    address there or one of ``lan_names`` (names ``refuse_redirects`` found there).
    """
    try:
        parts = urllib.parse.urlsplit(uri)
    except ValueError:
        return f"{uri!r} is not a URL"
    if parts.fragment or parts.username or parts.password:
        return f"{uri!r}: no fragment or credentials in a redirect URI"
    scheme = parts.scheme.lower()
    if scheme in _UNSAFE_SCHEMES:
        return f"{uri!r}: scheme {scheme} cannot be a redirect URI"
    if scheme in ("http", "https") and not parts.hostname:
        return f"{uri!r} has no host"
    host = parts.hostname or ""
    on_lan = host in lan_names or (_is_address(host) and in_networks(host, http_networks))
    if scheme == "http" and host not in LOOPBACK_HOSTS and not on_lan:
        return (
            f"{uri!r}: http redirect URIs must be on loopback or on a network listed in "
            "[oauth] http_networks; use https"
        )
    return None


async def refuse_redirects(uris: list[str], http_networks: tuple[Network, ...]) -> str | None:
    """Why one of ``uris`` cannot be a redirect URI, or None. A plain-HTTP URI whose host is a
    name (``homeassistant.local``) passes when every address it resolves to is on
    ``http_networks``."""
    lan_names: set[str] = set()
    for uri in uris:
        parts = urllib.parse.urlsplit(uri)
        host = parts.hostname or ""
        if not http_networks or parts.scheme != "http" or not host or _is_address(host):
            continue
        try:
            found = await anyio.getaddrinfo(host, None)
        except OSError:
            continue  # refused below, as any plain-HTTP name off the listed networks
        addresses = {str(entry[4][0]) for entry in found}
        if addresses and all(in_networks(address, http_networks) for address in addresses):
            lan_names.add(host)
    for uri in uris:
        refusal = redirect_refusal(uri, http_networks, frozenset(lan_names))
        if refusal is not None:
            return refusal
    return None


def loopback_match(registered: str, given: str) -> bool:
    """True when ``given`` is the loopback redirect URI ``registered`` with any port."""
    mine, theirs = urllib.parse.urlsplit(registered), urllib.parse.urlsplit(given)
    return (
        mine.scheme == theirs.scheme == "http"
        and mine.hostname in LOOPBACK_HOSTS
        and mine.hostname == theirs.hostname
        and (mine.path or "/") == (theirs.path or "/")
        and mine.query == theirs.query
    )


class PkceClient(OAuthClientInformationFull):
    """An app that must prove PKCE S256 (the SDK's authorize handler requires a challenge):
    its loopback redirect URIs match with any port (RFC 8252 §7.3), others exactly."""

    def validate_redirect_uri(self, redirect_uri: AnyUrl | None) -> AnyUrl:
        """``redirect_uri`` if registered (a loopback one with any port), as the SDK asks."""
        if redirect_uri is not None and any(
            loopback_match(str(uri), str(redirect_uri)) for uri in self.redirect_uris or ()
        ):
            return redirect_uri  # as given, port and all: the token request must repeat it
        return super().validate_redirect_uri(redirect_uri)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        return False
    return True
