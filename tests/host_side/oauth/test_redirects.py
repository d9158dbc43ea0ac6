"""Which redirect URIs an app may register and use (gateway/host_side/oauth/redirects.py)."""

from __future__ import annotations

import pytest
from mcp.shared.auth import InvalidRedirectUriError
from pydantic import AnyUrl

from gateway.host_side.oauth.redirects import (
    PkceClient,
    loopback_match,
    redirect_refusal,
    refuse_redirects,
)
from gateway.net.networks import networks

LAN = networks(("192.168.1.0/24",))


def client(*uris: str) -> PkceClient:
    """A registered public client with ``uris``."""
    return PkceClient.model_validate(
        {"client_id": "c", "redirect_uris": list(uris), "token_endpoint_auth_method": "none"}
    )


def test_a_loopback_redirect_matches_any_port_but_not_another_host_path_or_scheme() -> None:
    """RFC 8252 §7.3: the port is free on loopback; nothing else is."""
    assert loopback_match("http://localhost/callback", "http://localhost:49152/callback")
    assert loopback_match("http://127.0.0.1:9/callback", "http://127.0.0.1:5000/callback")
    assert loopback_match("http://[::1]/cb", "http://[::1]:5000/cb")
    assert not loopback_match("http://localhost/callback", "http://127.0.0.1:5000/callback")
    assert not loopback_match("http://localhost/callback", "http://localhost:5000/other")
    assert not loopback_match("http://localhost/callback", "https://localhost:5000/callback")
    assert not loopback_match("http://localhost/cb", "http://localhost:5000/cb?next=x")
    assert not loopback_match("https://app.example/cb", "https://app.example:8443/cb")


def test_a_pkce_client_is_given_back_the_uri_it_asked_for_port_and_all() -> None:
    """The URI returned is the one the request named, so the token request must repeat it."""
    asked = AnyUrl("http://localhost:49152/callback")
    assert client("http://localhost/callback").validate_redirect_uri(asked) == asked
    with pytest.raises(InvalidRedirectUriError):
        client("http://localhost/callback").validate_redirect_uri(AnyUrl("http://localhost/x"))
    exact = client("https://app.example/cb")
    with pytest.raises(InvalidRedirectUriError):
        exact.validate_redirect_uri(AnyUrl("https://app.example:8443/cb"))


def test_plain_http_redirects_only_on_loopback_and_listed_networks() -> None:
    """An address on http_networks may take a plain-HTTP redirect; others must use https."""
    assert redirect_refusal("http://127.0.0.1:8123/auth/external/callback") is None
    assert redirect_refusal("http://192.168.1.10:8123/auth/external/callback", LAN) is None
    refused = redirect_refusal("http://192.168.1.10:8123/auth/external/callback")
    assert refused is not None and "http_networks" in refused
    assert redirect_refusal("http://192.168.2.10/cb", LAN) is not None
    assert redirect_refusal("http://homeassistant.local:8123/cb", LAN) is not None  # unresolved
    assert redirect_refusal("https://app.example/cb#frag") is not None
    assert redirect_refusal("javascript:alert(1)") is not None


@pytest.mark.anyio
async def test_refuse_redirects_names_the_first_unusable_uri() -> None:
    """Each URI is checked; the first refused one is named (addresses need no resolution)."""
    ok = "http://192.168.1.10:8123/auth/external/callback"
    assert await refuse_redirects([ok, "https://my.home-assistant.io/redirect/oauth"], LAN) is None
    refusal = await refuse_redirects([ok, "http://10.1.1.1/cb"], LAN)
    assert refusal is not None and "10.1.1.1" in refusal
