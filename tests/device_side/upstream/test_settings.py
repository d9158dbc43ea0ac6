"""The upstream's connection settings: read strictly, kept per device in a private file."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from gateway.device_side.upstream.ota_reply import proxied_reply
from gateway.device_side.upstream.settings import (
    UpstreamSettingsError,
    UpstreamWebSocket,
    WebSocketUpstreams,
    check_destination,
    destination_of,
    parse_upstream_websocket,
    server_of,
)
from gateway.errors import StorageUnavailable
from gateway.net.destinations import DestinationRefused
from tests.net.test_destinations import patch_resolver

DEVICE = "aa:bb:cc:dd:ee:10"
OWN = {"url": "ws://192.168.1.5:8765/xiaozhi/v1/", "token": "gateway-credential", "version": 1}


def test_a_websocket_section_is_read_as_the_device_reads_it() -> None:
    section = {"url": "wss://api.tenclass.net/xiaozhi/v1/", "token": "test-token", "version": 3}
    upstream = parse_upstream_websocket(section)
    assert upstream == UpstreamWebSocket("wss://api.tenclass.net/xiaozhi/v1/", "test-token", 3)
    assert upstream.where == "wss://api.tenclass.net" and "test-token" not in repr(upstream)
    assert parse_upstream_websocket({"url": "ws://h/x"}) == UpstreamWebSocket("ws://h/x", None)
    assert server_of("https://user:pw@h:8443/ota/?k=v") == "https://h:8443"


@pytest.mark.parametrize(
    ("section", "why"),
    [
        ([], "not a JSON object"),
        ({}, "url is missing"),
        ({"url": "x" * 2000}, "url is missing"),
        ({"url": "http://h/x"}, "not ws://"),
        ({"url": "ws:///x"}, "not ws://"),
        ({"url": "ws://h:99999/"}, "malformed"),
        ({"url": "ws://h/", "token": 5}, "token"),
        ({"url": "ws://h/", "token": "t\r\nX-Injected: 1"}, "token"),  # would be a header line
        ({"url": "ws://h/", "version": 4}, "version"),
        ({"url": "ws://h/", "version": "1"}, "version"),
        ({"url": "ws://h/xiaozhi/v1/#x"}, "has a fragment"),  # connect() raised InvalidURI
        ({"url": "ws://u@h/"}, "username provided without password"),  # websockets' own words
        ({"url": "ws://" + "a" * 64 + "\u00e9.example/"}, "cannot be encoded"),  # IDNA
    ],
)
def test_an_unusable_websocket_section_says_why(section: Any, why: str) -> None:
    with pytest.raises(UpstreamSettingsError, match=why):
        parse_upstream_websocket(section)


@pytest.mark.parametrize("url", ["https://u:s3cret@h/x?token=s3cret", "ws://u:s3cret@h:99999/",
                                 "ws://s3cret@h/x?token=s3cret"])  # fmt: skip
def test_why_never_names_a_secret_in_the_url(url: str) -> None:
    """The reason is logged, listed to hosts and shown on the dashboard: the host, no more."""
    with pytest.raises(UpstreamSettingsError) as refused:
        parse_upstream_websocket({"url": url})
    assert "s3cret" not in str(refused.value) and "://h" in str(refused.value)


def test_settings_survive_a_restart_in_a_private_file(tmp_path: Path) -> None:
    store = WebSocketUpstreams(tmp_path)
    upstream = UpstreamWebSocket("wss://api.tenclass.net/xiaozhi/v1/", "t", 1)
    store.put(DEVICE.upper(), upstream)
    path = tmp_path / "upstream_websocket.json"
    assert path.stat().st_mode & 0o777 == 0o600
    written = path.stat().st_mtime_ns
    store.put(DEVICE, upstream)  # every boot checks in: nothing changed, nothing written
    assert path.stat().st_mtime_ns == written
    assert WebSocketUpstreams(tmp_path).get(DEVICE) == upstream
    store.put(DEVICE, None)
    assert WebSocketUpstreams(tmp_path).get(DEVICE) is None


def test_an_unreadable_file_is_said_and_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "upstream_websocket.json"
    path.write_text("{not json")
    with caplog.at_level(logging.WARNING):
        assert WebSocketUpstreams(tmp_path).get(DEVICE) is None
    path.write_text(json.dumps({DEVICE: {"url": "ftp://x"}, "b": {"url": "ws://h/"}}))
    with caplog.at_level(logging.WARNING):
        store = WebSocketUpstreams(tmp_path)
    assert store.get(DEVICE) is None and store.get("b") == UpstreamWebSocket("ws://h/", None)
    assert "unreadable" in caplog.text and "unusable" in caplog.text


def test_an_unreadable_file_is_never_written_over(tmp_path: Path) -> None:
    """A check-in's settings are refused, not saved over a file that cannot be read."""
    path = tmp_path / "upstream_websocket.json"
    path.write_text('{"aa:bb:cc:dd:ee:01": {"url": "ws://h/"')
    store = WebSocketUpstreams(tmp_path)
    with pytest.raises(StorageUnavailable, match="upstream_websocket.json"):
        store.put(DEVICE, UpstreamWebSocket("ws://h/", None))
    assert path.read_text() == '{"aa:bb:cc:dd:ee:01": {"url": "ws://h/"'
    assert store.get(DEVICE) is None  # nothing changed, in memory either


def test_an_unusable_entry_stays_in_the_file_until_its_device_checks_in(tmp_path: Path) -> None:
    """Saving another device's settings keeps an entry that could not be used, as it was; the
    device's own next check-in replaces it."""
    path = tmp_path / "upstream_websocket.json"
    path.write_text(json.dumps({DEVICE: {"url": "ftp://x"}}))
    store = WebSocketUpstreams(tmp_path)
    store.put("b", UpstreamWebSocket("ws://h/", None))
    assert json.loads(path.read_text())[DEVICE] == {"url": "ftp://x"}
    store.put(DEVICE, UpstreamWebSocket("ws://i/", None))
    assert WebSocketUpstreams(tmp_path).get(DEVICE) == UpstreamWebSocket("ws://i/", None)


class _Mqtt:
    """The MQTT half as the OTA endpoint sees it: the device's section, and what is kept."""

    def __init__(self) -> None:
        self.kept: dict[str, Any] = {}

    def device_section(self, theirs: Any, own: Any) -> dict[str, Any]:
        if "endpoint" not in theirs:
            raise UpstreamSettingsError("no endpoint")
        return dict(own)

    def keep(self, device_id: str, theirs: Any) -> None:
        self.kept[device_id] = theirs


XIAOZHI_ME = {
    "server_time": {"timestamp": 1, "timezone_offset": 480},
    "firmware": {"version": "2.4.2", "url": ""},
    "activation": {"code": "123456", "message": "xiaozhi.me", "challenge": "c"},
    "mqtt": {"endpoint": "mqtt.xiaozhi.me", "client_id": "GID_test@@@aa_bb@@@u",
             "username": "u", "password": "p", "publish_topic": "device-server",
             "subscribe_topic": "null"},
    "websocket": {"url": "wss://api.tenclass.net/xiaozhi/v1/", "token": "test-token"},
    "future": {"kept": True},
}  # fmt: skip


def test_the_reply_keeps_the_upstreams_parts_and_names_the_gateway() -> None:
    proxied = proxied_reply(XIAOZHI_ME, OWN)
    reply = proxied.reply
    for kept in ("server_time", "firmware", "activation", "future"):
        assert reply[kept] == XIAOZHI_ME[kept]
    assert reply["websocket"] == {"url": OWN["url"], "token": OWN["token"]}  # no version added
    assert "mqtt" not in reply and proxied.transport == "websocket" and proxied.mqtt is None
    assert proxied.websocket == UpstreamWebSocket(XIAOZHI_ME["websocket"]["url"], "test-token")
    versioned = {**XIAOZHI_ME, "websocket": {**XIAOZHI_ME["websocket"], "version": 3}}
    assert proxied_reply(versioned, OWN).reply["websocket"]["version"] == 3  # frames as before


def test_with_the_mqtt_half_the_device_gets_the_gateways_broker() -> None:
    own_mqtt = {"endpoint": "192.168.1.5:1883", "client_id": DEVICE}
    proxied = proxied_reply(XIAOZHI_ME, OWN, own_mqtt, _Mqtt())
    assert proxied.reply["mqtt"] == own_mqtt and proxied.transport == "mqtt"
    assert proxied.mqtt == XIAOZHI_ME["mqtt"]
    only_mqtt = {k: v for k, v in XIAOZHI_ME.items() if k != "websocket"}
    assert proxied_reply(only_mqtt, OWN, own_mqtt, _Mqtt()).websocket is None
    with pytest.raises(UpstreamSettingsError, match="no endpoint"):
        proxied_reply({**only_mqtt, "mqtt": {}}, OWN, own_mqtt, _Mqtt())
    with pytest.raises(UpstreamSettingsError, match="mqtt section is not a JSON object"):
        proxied_reply({**only_mqtt, "mqtt": "x"}, OWN, own_mqtt, _Mqtt())


def test_a_reply_the_gateway_cannot_proxy_says_why() -> None:
    only_mqtt = {k: v for k, v in XIAOZHI_ME.items() if k != "websocket"}
    with pytest.raises(UpstreamSettingsError, match="only mqtt.*MQTT broker"):
        proxied_reply(only_mqtt, OWN)
    with pytest.raises(UpstreamSettingsError, match="neither websocket nor mqtt"):
        proxied_reply({"server_time": {}}, OWN)
    with pytest.raises(UpstreamSettingsError, match="websocket.url"):
        proxied_reply({"websocket": {"url": 3}}, OWN)


TENCLASS_OTA = "https://api.tenclass.net/xiaozhi/ota/"


@pytest.mark.parametrize(
    ("url", "where"),
    [
        ("ws://127.0.0.1:8000/mcp", "this machine"),  # the gateway's own host listener
        ("ws://localhost:8123/api/websocket", "this machine"),
        ("http://app.localhost/", "this machine"),
        ("ws://0.0.0.0:8000/", "this machine"),  # Linux connects that to loopback
        ("ws://[::1]:8000/", "this machine"),
        ("http://[::ffff:127.0.0.1]/", "this machine"),
        ("http://169.254.169.254/latest/meta-data/", "the link-local network"),
        ("ws://[fe80::1]/", "the link-local network"),
        ("http://[::1/vision", "malformed"),
        ("ws://127.1:8000/", "this machine"),  # the numeric forms the resolver takes
        ("ws://0:8000/", "this machine"),
        ("ws://2130706433:8000/", "this machine"),
        ("ws://0x7f000001:8000/", "this machine"),
        ("ws://0177.0.0.1:8000/", "this machine"),
        ("mqtt://127.1:1883", "this machine"),
        ("http://2852039166/", "the link-local network"),
        ("http://0xa9fea9fe/", "the link-local network"),
        ("http://169.254.169.254./", "the link-local network"),
        ("ws://user:secret@voice.example/xiaozhi/v1/", "user info"),  # a second Authorization
        ("ws://voice.example/xiaozhi v1/", "spaces"),
        ("ws://voice.example/xiaozhi/v1/\r\nX-Evil: 1", "control characters"),
    ],
)
def test_a_server_cannot_point_the_gateway_at_its_own_machine(url: str, where: str) -> None:
    """A URL the voice server gives is followed from the gateway's host: not to loopback (its
    own listeners), not to link-local (cloud metadata), unless the operator's ota_url is."""
    with pytest.raises(UpstreamSettingsError, match=where):
        check_destination(url, TENCLASS_OTA)


@pytest.mark.parametrize(
    "url",
    ["ws://127.1:8000/", "ws://2130706433:8000/", "ws://localhost:8000/", "mqtt://0:1883",
     "http://169.254.169.254./", "ws://0xa9fea9fe/"],
)  # fmt: skip
@pytest.mark.anyio
async def test_every_form_is_refused_once_resolved_as_the_connection_is_made(url: str) -> None:
    with pytest.raises(UpstreamSettingsError, match="points at"):
        await destination_of(url, TENCLASS_OTA)


@pytest.mark.parametrize(
    "url", ["ws://voice.example:8000/xiaozhi/v1/", "mqtt://voice.example:1883",
            "http://voice.example/vision/explain"],
)  # fmt: skip
@pytest.mark.anyio
async def test_a_name_that_resolves_to_loopback_is_refused_like_the_address(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """WebSocket, MQTT broker and camera URLs alike: the resolver's answer is what counts."""
    patch_resolver(monkeypatch, {"voice.example": ["127.0.0.1"]})
    with pytest.raises(UpstreamSettingsError, match="points at this machine"):
        await destination_of(url, TENCLASS_OTA)


@pytest.mark.anyio
async def test_the_destination_is_the_checked_address_and_the_servers_own_may_be_local() -> None:
    ota = "http://localhost:8002/xiaozhi/ota/"  # a voice server on this machine: its URLs too
    destination = await destination_of("ws://127.1:8000/xiaozhi/v1/", ota)
    assert (destination.address, destination.port) == ("127.0.0.1", 8000)
    assert (await destination_of("wss://127.0.0.1/", ota)).port == 443
    with pytest.raises(UpstreamSettingsError, match="link-local"):
        await destination_of("http://2852039166/", ota)
    with pytest.raises(DestinationRefused, match="does not resolve"):
        await destination_of("ws://no-such-host.invalid/", ota)


def test_what_the_operator_points_at_the_server_may_point_at_too() -> None:
    check_destination("wss://api.tenclass.net/xiaozhi/v1/", TENCLASS_OTA)
    check_destination("ws://192.168.1.10:8000/xiaozhi/v1/", "http://192.168.1.10:8002/ota/")
    check_destination("ws://127.0.0.1:8000/xiaozhi/v1/", "http://localhost:8002/xiaozhi/ota/")
    with pytest.raises(UpstreamSettingsError, match="link-local"):
        check_destination("http://169.254.169.254/", "http://127.0.0.1:8002/xiaozhi/ota/")
