"""The OTA endpoint: every reply obeys docs/protocol.md §3 and §7.1; check-ins register."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import httpx2
import pytest
from websockets.asyncio.client import connect

from gateway.config import ListenAddress, load_config
from gateway.device_side.broker import DeviceCredentials
from gateway.device_side.ota import MAX_KEY, CheckIn, OtaEndpoint, check_reply, parse_check_in
from gateway.errors import ConfigError
from gateway.net.public import PublicAddress
from tests.conftest import gateway, make_config
from tests.e2e.helpers import STOCK_HELLO, receive_json
from tests.fakes import Stack

DEVICE = "aa:bb:cc:dd:ee:ff"
STOCK_HEADERS = {
    "Activation-Version": "1",
    "Device-Id": DEVICE.upper(),
    "Client-Id": "5b3f4c1e-0000-4000-8000-000000000001",
    "User-Agent": "bread-compact-wifi/2.4.2",
    "Accept-Language": "zh-CN",
    "Content-Type": "application/json",
}
STOCK_BODY = {
    "version": 2,
    "mac_address": DEVICE,
    "chip_model_name": "esp32s3",
    "application": {"name": "xiaozhi", "version": "2.4.2"},
    "board": {"type": "bread-compact-wifi", "ssid": "MyWiFi", "mac": DEVICE},
}
SAFE: dict[str, Any] = {
    "server_time": {"timestamp": 1754640000000, "timezone_offset": 480},
    "mqtt": {"endpoint": "h:1883", "client_id": DEVICE, "keepalive": 240},
    "websocket": {"url": "ws://h:8765/xiaozhi/v1/", "token": "t", "version": 1},
}


def endpoint(tmp_path: Path, **overrides: Any) -> tuple[OtaEndpoint, Stack]:
    config = make_config(tmp_path, **overrides)
    stack = Stack(config)
    ota = OtaEndpoint(config, stack.registry, DeviceCredentials(tmp_path), PublicAddress(config))
    ota.mqtt_started(lambda device_id: None, broker_port=1883)
    return ota, stack


CHECK_IN = CheckIn(DEVICE, "uuid", "bread-compact-wifi", "2.4.2")


# --- the rules every reply obeys --------------------------------------------------------------


def test_check_reply_fails_on_a_key_longer_than_15_characters() -> None:
    """A 16-character key in the mqtt block would abort the device at every boot."""
    assert check_reply(SAFE) == []
    reply = {**SAFE, "mqtt": {**SAFE["mqtt"], "subscribe_topics": "x"}}
    assert any("subscribe_topics" in p for p in check_reply(reply))


def test_check_reply_fails_on_activation() -> None:
    """An activation block would make the device wait for a code forever."""
    assert any("activation" in p for p in check_reply({**SAFE, "activation": {"code": "1"}}))


@pytest.mark.parametrize("version", ["v2", "2.4.x", "", "2..4", 2])
def test_check_reply_fails_on_a_non_numeric_firmware_version(version: object) -> None:
    """std::stoi on a non-numeric part throws, uncaught, at every boot."""
    reply = {**SAFE, "firmware": {"version": version, "url": "http://h/fw.bin"}}
    assert any("firmware.version" in p for p in check_reply(reply))
    assert check_reply({**SAFE, "firmware": {"version": "2.4.10", "url": "u"}}) == []


@pytest.mark.parametrize(
    "reply",
    [
        {"server_time": SAFE["server_time"]},  # neither transport
        {"server_time": SAFE["server_time"], "mqtt": SAFE["mqtt"]},  # nothing for WebSocket-only
        {**SAFE, "websocket": {"url": "ws://h/", "token": "t" * 300}},  # an overlong token
        {**SAFE, "mqtt": {"password": "x" * 300}},  # an overlong value
        {**SAFE, "mqtt": {"nested": {"a": 1}}},  # not a string or number
        {**SAFE, "websocket": {**SAFE["websocket"], "é" * 8: "x"}},  # 8 characters, 16 bytes
        {**SAFE, "server_time": {"timestamp": "now"}},
        {**SAFE, "firmware": {"version": "2.4.3"}},  # no url
    ],
)
def test_check_reply_fails_on_anything_else_a_device_cannot_take(reply: dict[str, Any]) -> None:
    """Each of these would misconfigure or crash a stock device."""
    assert check_reply(reply) != []


def test_default_reply_is_mqtt_with_per_device_credentials(tmp_path: Path) -> None:
    """The default: server_time, mqtt and websocket blocks, no firmware, no activation."""
    ota, stack = endpoint(tmp_path, mqtt_listen=ListenAddress("127.0.0.1", 0))
    reply = ota.reply(CHECK_IN, "192.168.1.20:8765")
    stack.close()
    assert set(reply) == {"server_time", "mqtt", "websocket"} and check_reply(reply) == []
    # Stock firmware takes mqtt when present; a WebSocket-only client still finds its URL.
    assert reply["websocket"]["url"] == "ws://192.168.1.20:8765/xiaozhi/v1/"
    assert reply["websocket"]["token"] == reply["mqtt"]["password"]
    assert reply["mqtt"] == {
        "endpoint": "192.168.1.20:1883",
        "client_id": DEVICE,
        "username": DEVICE,
        "password": DeviceCredentials(tmp_path).password_for(DEVICE, "uuid"),
        "publish_topic": f"xiaozhi/{DEVICE}/up",
        "keepalive": 240,
    }
    assert all(len(key) <= MAX_KEY for key in reply["mqtt"])
    assert isinstance(reply["server_time"]["timestamp"], int)


def test_websocket_reply_uses_the_public_url_and_a_token_of_its_own(tmp_path: Path) -> None:
    """ota.transport = websocket: the URL on public_url, and never the shared device token."""
    ota, stack = endpoint(tmp_path, ota_transport="websocket",
                          public_url="https://gw.example:8443")  # fmt: skip
    reply = ota.reply(CHECK_IN, "10.0.0.1:8765")
    stack.close()
    assert reply["websocket"] == {
        "url": "wss://gw.example:8443/xiaozhi/v1/",
        "token": DeviceCredentials(tmp_path).password_for(DEVICE, "uuid"),
        "version": 1,
    }
    assert "mqtt" not in reply and check_reply(reply) == []


def test_mqtt_off_means_websocket(tmp_path: Path) -> None:
    """Without a broker the device is told to use the WebSocket, on the Host it used."""
    ota, stack = endpoint(tmp_path, mqtt_listen=None)
    reply = ota.reply(CHECK_IN, "192.168.1.20:8765")
    stack.close()
    assert reply["websocket"]["url"] == "ws://192.168.1.20:8765/xiaozhi/v1/"


def test_external_broker_endpoint_and_public_endpoint(tmp_path: Path) -> None:
    """External mode gives the broker's address, unless public_endpoint says otherwise."""
    ota, stack = endpoint(tmp_path, mqtt_mode="external", mqtt_host="broker.lan", mqtt_port=1884)
    assert ota.reply(CHECK_IN)["mqtt"]["endpoint"] == "broker.lan:1884"
    stack.close()
    ota, stack = endpoint(tmp_path, mqtt_listen=ListenAddress("0.0.0.0", 1883),
                          mqtt_public_endpoint="mqtt.example:8883")  # fmt: skip
    assert ota.reply(CHECK_IN)["mqtt"]["endpoint"] == "mqtt.example:8883"
    stack.close()


def test_firmware_is_offered_only_when_configured(tmp_path: Path) -> None:
    """A numeric version and a URL, both from the config."""
    ota, stack = endpoint(tmp_path, ota_firmware_version="2.4.3",
                          ota_firmware_url="http://h/fw.bin")  # fmt: skip
    reply = ota.reply(CHECK_IN)
    stack.close()
    assert reply["firmware"] == {"version": "2.4.3", "url": "http://h/fw.bin"}
    assert check_reply(reply) == []


def test_firmware_settings_are_checked_at_start(tmp_path: Path) -> None:
    """A non-numeric version, or a version without a URL, is a configuration error."""
    with pytest.raises(ConfigError) as excinfo:
        load_config(
            None, env={"GATEWAY_DATA_DIR": str(tmp_path), "GATEWAY_OTA_FIRMWARE_VERSION": "v2"}
        )
    assert excinfo.value.key == "GATEWAY_OTA_FIRMWARE_VERSION"
    with pytest.raises(ConfigError, match="firmware_url"):
        endpoint(tmp_path, ota_firmware_version="2.4.3")


@pytest.mark.parametrize(
    ("env", "key"),
    [
        ({"GATEWAY_MQTT_MODE": "cloud"}, "GATEWAY_MQTT_MODE"),
        ({"GATEWAY_MQTT_PORT": "70000"}, "GATEWAY_MQTT_PORT"),
        ({"GATEWAY_MQTT_TOPIC_PREFIX": "a/#"}, "GATEWAY_MQTT_TOPIC_PREFIX"),
        ({"GATEWAY_MQTT_PUBLIC_ENDPOINT": "h:x"}, "GATEWAY_MQTT_PUBLIC_ENDPOINT"),
        ({"GATEWAY_MQTT_PUBLIC_ENDPOINT": "[::1]:1883"}, "GATEWAY_MQTT_PUBLIC_ENDPOINT"),
        ({"GATEWAY_MQTT_HOST": " "}, "GATEWAY_MQTT_HOST"),
        ({"GATEWAY_OTA_TRANSPORT": "udp"}, "GATEWAY_OTA_TRANSPORT"),
    ],
)
def test_mqtt_and_ota_mistakes_name_their_key(
    tmp_path: Path, env: dict[str, str], key: str
) -> None:
    """Each wrong [mqtt] or [ota] value raises ConfigError naming the key."""
    with pytest.raises(ConfigError) as excinfo:
        load_config(None, env={"GATEWAY_DATA_DIR": str(tmp_path), **env})
    assert excinfo.value.key == key


def test_mqtt_settings_from_the_environment(tmp_path: Path) -> None:
    """The [mqtt] keys follow the GATEWAY_<TABLE>_<KEY> rule."""
    env = {"GATEWAY_DATA_DIR": str(tmp_path), "GATEWAY_MQTT_MODE": "external",
           "GATEWAY_MQTT_TLS": "yes", "GATEWAY_MQTT_CA_FILE": "~/ca.pem",
           "GATEWAY_MQTT_PUBLIC_ENDPOINT": "broker.lan:8883"}  # fmt: skip
    config = load_config(None, env=env)
    assert config.mqtt_mode == "external" and config.mqtt_tls
    assert config.mqtt_ca_file == Path("~/ca.pem").expanduser()
    assert config.mqtt_public_endpoint == "broker.lan:8883"


# --- the public address -----------------------------------------------------------------------


def test_loopback_public_address_is_warned_when_devices_are_on_the_lan(tmp_path: Path) -> None:
    """A loopback public_url (or external broker host) with a LAN listener is a mistake."""
    lan = make_config(tmp_path, device_listen=ListenAddress("0.0.0.0", 8765),
                      public_url="http://127.0.0.1:8765")  # fmt: skip
    assert any("device_url" in w for w in PublicAddress(lan).warnings())
    external = dataclasses.replace(lan, public_url=None, mqtt_mode="external")
    assert any("mqtt.host" in w for w in PublicAddress(external).warnings())
    fine = dataclasses.replace(lan, public_url="http://192.168.1.20:8765")
    assert PublicAddress(fine).warnings() == []
    local = make_config(tmp_path, public_url="http://127.0.0.1:8765")  # loopback listener
    assert PublicAddress(local).warnings() == []


def test_public_address_comes_from_config_then_the_device_then_the_listener(
    tmp_path: Path,
) -> None:
    """public_url wins; else the Host the device used; else the listener."""
    public = PublicAddress(make_config(tmp_path, device_listen=ListenAddress("0.0.0.0", 8765)))
    assert public.device_base("[fe80::1]:9000") == ("http", "fe80::1", 9000)
    assert public.websocket_url("gw.lan") == "ws://gw.lan/xiaozhi/v1/"
    assert public.device_base() == ("http", "127.0.0.1", 8765)
    public.seen = ("192.168.1.20", 8765)
    assert public.device_base() == ("http", "192.168.1.20", 8765)
    with pytest.raises(ConfigError):
        PublicAddress(make_config(tmp_path, public_url="gw.lan:8765"))


def test_check_in_reads_headers_and_survives_a_broken_body() -> None:
    """Headers first; a body with an unescaped SSID still leaves them usable."""
    headers = {k.lower(): v for k, v in STOCK_HEADERS.items()}
    check_in = parse_check_in(headers, b'{"board":{"ssid":"My"WiFi"}}')
    assert check_in == CheckIn(DEVICE, STOCK_HEADERS["Client-Id"], "bread-compact-wifi", "2.4.2")
    from_body = parse_check_in({}, json.dumps(STOCK_BODY).encode())
    assert from_body == CheckIn(DEVICE, None, "bread-compact-wifi", "2.4.2")
    assert isinstance(parse_check_in({"device-id": "a/b"}, b""), str)
    assert isinstance(parse_check_in({}, b"[1]"), str)


# --- the endpoint in a running gateway ------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.e2e
async def test_ota_post_registers_the_device_and_answers_with_mqtt(tmp_path: Path) -> None:
    """A stock boot POST gets a safe mqtt reply and puts the device in the registry."""
    async with gateway(tmp_path, mqtt_listen=ListenAddress("127.0.0.1", 0)) as run:
        url = f"http://127.0.0.1:{run.device_port}/xiaozhi/ota/"
        async with httpx2.AsyncClient() as http:
            response = await http.post(url, headers=STOCK_HEADERS, json=STOCK_BODY)
            assert (await http.get(url)).status_code == 200
        reply = response.json()
        assert response.status_code == 200 and check_reply(reply) == []
        broker = run.gateway.broker
        assert broker is not None
        assert reply["mqtt"]["endpoint"] == f"127.0.0.1:{broker.port}"
        device = run.gateway.registry.find(DEVICE)
        assert device is not None and not device.online
        assert device.record.board == "bread-compact-wifi" and device.firmware == "2.4.2"
        assert device.record.transport == "mqtt" and device.alias.startswith("bread-compact")


@pytest.mark.anyio
@pytest.mark.e2e
async def test_ota_refuses_a_request_without_a_device_id(tmp_path: Path) -> None:
    """No Device-Id and no MAC in the body: HTTP 400, nothing registered."""
    async with gateway(tmp_path) as run:
        url = f"http://127.0.0.1:{run.device_port}/xiaozhi/ota"
        async with httpx2.AsyncClient() as http:
            response = await http.post(url, content=b"{}")
        assert response.status_code == 400
        assert run.gateway.registry.devices() == []


@pytest.mark.anyio
@pytest.mark.e2e
async def test_unsafe_reply_is_never_sent(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A configuration that would brick devices gets HTTP 500 (the device retries later)."""
    caplog.set_level(logging.ERROR, "gateway.device_side.ota")
    overrides = {"mqtt_topic_prefix": "x" * 300, "mqtt_listen": ListenAddress("127.0.0.1", 0)}
    async with gateway(tmp_path, **overrides) as run:
        url = f"http://127.0.0.1:{run.device_port}/xiaozhi/ota/"
        async with httpx2.AsyncClient() as http:
            response = await http.post(url, headers=STOCK_HEADERS, json=STOCK_BODY)
        assert response.status_code == 500
        assert f"unsafe OTA reply to {DEVICE}" in caplog.text  # which device, and why
        assert "gets no transport until this is fixed: mqtt.publish_topic" in caplog.text


@pytest.mark.anyio
@pytest.mark.e2e
async def test_a_websocket_only_client_finds_its_url_in_the_default_reply(tmp_path: Path) -> None:
    """py-xiaozhi ``--protocol websocket``: it reads websocket.url/token and is answered there."""
    async with gateway(tmp_path, mqtt_listen=ListenAddress("127.0.0.1", 0)) as run:
        url = f"http://127.0.0.1:{run.device_port}/xiaozhi/ota/"
        async with httpx2.AsyncClient() as http:
            reply = (await http.post(url, headers=STOCK_HEADERS, json=STOCK_BODY)).json()
        assert "mqtt" in reply  # stock firmware keeps choosing MQTT
        offered = reply["websocket"]
        headers = {
            "Authorization": f"Bearer {offered['token']}",
            "Protocol-Version": str(offered["version"]),
            "Device-Id": DEVICE,
            "Client-Id": STOCK_HEADERS["Client-Id"],
        }
        async with connect(offered["url"], additional_headers=headers) as ws:
            await ws.send(json.dumps(STOCK_HELLO))
            hello = await receive_json(ws)
        assert hello["type"] == "hello" and hello["transport"] == "websocket"
        device = run.gateway.registry.find(DEVICE)
        assert device is not None and not device.approved  # its own token: pending approval
