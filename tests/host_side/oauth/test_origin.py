"""Issuer, resource and the right to tokens, per request (gateway/host_side/oauth/origin.py)."""

from __future__ import annotations

from pathlib import Path

from starlette.requests import HTTPConnection

from gateway.host_side.oauth.origin import OriginRules
from gateway.net.peer import PEER
from tests.conftest import make_config


def connection(
    peer: str, scheme: str = "http", socket: str | None = None, **headers: str
) -> HTTPConnection:
    """A request as uvicorn hands it over, from ``peer`` (through uvicorn's proxy headers from
    ``socket``, when given)."""
    raw = [(b"host", b"gw.lan:8766")] + [
        (name.replace("_", "-").encode(), value.encode()) for name, value in headers.items()
    ]
    return HTTPConnection({"type": "http", "scheme": scheme, "server": ("10.0.0.2", 8766),
                           "path": "/token", "headers": raw, "client": (peer, 5000),
                           PEER: (socket or peer, 5000)})  # fmt: skip


def test_plain_http_gets_tokens_on_loopback_and_listed_networks_only(tmp_path: Path) -> None:
    """Plain HTTP from the LAN may not get tokens unless the owner listed its network."""
    rules = OriginRules(make_config(tmp_path))
    listed = OriginRules(make_config(tmp_path, oauth_http_networks=("172.30.32.0/23",)))
    assert rules.of(connection("127.0.0.1")).may_issue
    assert not rules.of(connection("192.168.1.20")).may_issue
    assert not rules.of(connection("172.30.32.5")).may_issue
    assert listed.of(connection("172.30.32.5")).may_issue
    assert rules.of(connection("192.168.1.20", scheme="https")).may_issue


def test_issuer_is_the_request_url_unless_a_public_url_is_configured(tmp_path: Path) -> None:
    """Without [host] public_url the issuer is the URL the request came in on."""
    plain = OriginRules(make_config(tmp_path)).of(connection("127.0.0.1"))
    public = OriginRules(make_config(tmp_path, host_public_url="https://devices.example.com"))
    assert (plain.issuer, plain.resource) == ("http://gw.lan:8766", "http://gw.lan:8766/mcp")
    origin = public.of(connection("192.168.1.20"))
    assert origin.issuer == "https://devices.example.com" and origin.may_issue
    assert origin.resource_metadata == (
        "https://devices.example.com/.well-known/oauth-protected-resource/mcp"
    )


def test_forwarded_headers_count_only_from_trusted_proxies(tmp_path: Path) -> None:
    """X-Forwarded-* from a configured proxy name the scheme, host and client; anyone else's
    are ignored (they would let a LAN client claim HTTPS)."""
    forwarded = {"x_forwarded_proto": "https", "x_forwarded_host": "devices.example.com",
                 "x_forwarded_for": "203.0.113.9, 198.51.100.7"}  # fmt: skip
    trusted = OriginRules(make_config(tmp_path, host_trusted_proxies=("10.0.0.5",)))
    via_proxy = trusted.of(connection("10.0.0.5", **forwarded))
    spoofed = trusted.of(connection("192.168.1.20", **forwarded))
    assert via_proxy.issuer == "https://devices.example.com" and via_proxy.may_issue
    assert via_proxy.address == "198.51.100.7"
    assert spoofed.issuer == "http://gw.lan:8766" and not spoofed.may_issue
    assert spoofed.address == "192.168.1.20"


def test_a_proxy_named_only_in_x_forwarded_for_is_not_believed(tmp_path: Path) -> None:
    """A local process that names the trusted proxy in X-Forwarded-For (which uvicorn's proxy
    headers turn into the request's client) does not get its X-Forwarded-* believed."""
    trusted = OriginRules(make_config(tmp_path, host_trusted_proxies=("10.0.0.5",)))
    forged = trusted.of(connection("10.0.0.5", socket="127.0.0.1", x_forwarded_proto="https",
                                   x_forwarded_host="evil.example"))  # fmt: skip
    assert forged.issuer == "http://gw.lan:8766"


def test_the_url_typed_is_the_resource_when_it_names_this_gateway(tmp_path: Path) -> None:
    """With [host] public_url set, a request to one of the gateway's own names (loopback, the
    address its socket reached, an allowed host) is told that very URL; the public name, and
    names that are not the gateway's, get the public URL."""
    names = ("gw.home:*", "devices.example.com")
    public = "https://devices.example.com"
    rules = OriginRules(make_config(tmp_path, host_public_url=public, host_allowed_hosts=names))

    def issuer(host: str) -> str:
        conn = connection("192.168.1.20")
        conn.scope["headers"] = [(b"host", host.encode())]
        return rules.of(conn).issuer

    assert issuer("10.0.0.2:8766") == "http://10.0.0.2:8766"  # the LAN address reached
    assert issuer("127.0.0.1:8766") == "http://127.0.0.1:8766"
    assert issuer("gw.home:8766") == "http://gw.home:8766"
    assert issuer("devices.example.com") == "https://devices.example.com"  # a tunnel, plain
    assert issuer("10.0.0.9:8766") == "https://devices.example.com"  # not this socket's
    proxied = connection("127.0.0.1", x_forwarded_proto="https", x_forwarded_for="203.0.113.9")
    proxied.scope["headers"].append((b"host", b"127.0.0.1:8766"))
    proxied.scope["headers"].pop(0)  # nginx's default: the Host of its upstream
    assert rules.of(proxied).issuer == "https://devices.example.com"
    lan = connection("192.168.1.20")
    lan.scope["headers"] = [(b"host", b"10.0.0.2:8766")]
    assert not rules.of(lan).may_issue  # plain HTTP off the listed networks
