"""Tests for gateway.net.addresses and ``Config.mqtt_broker``: one answer per address."""

from __future__ import annotations

import dataclasses
import ipaddress
from pathlib import Path

import pytest

from gateway.cli.doctor import Probes, diagnose
from gateway.config import Config, ListenAddress
from gateway.device_side.ota import OtaEndpoint
from gateway.net.addresses import UNKNOWN_LAN, Addresses, is_wildcard, lan_address, local_host
from gateway.net.public import PublicAddress
from tests.conftest import make_config

LAN = "192.168.1.20"


@pytest.mark.parametrize(
    ("bind", "client"),
    [("0.0.0.0", "127.0.0.1"), ("", "127.0.0.1"), ("::", "::1"), ("[::]", "::1"),
     ("10.0.0.5", "10.0.0.5"), ("::1", "::1"), ("localhost", "localhost")],
)  # fmt: skip
def test_a_wildcard_bind_gives_one_loopback_answer(bind: str, client: str) -> None:
    """0.0.0.0 -> 127.0.0.1 and :: -> ::1 (a :: socket may be IPv6-only), everywhere."""
    assert local_host(bind) == client
    assert is_wildcard(bind) == (bind in ("0.0.0.0", "", "::", "[::]"))


def test_lan_address_is_an_address_or_a_name_never_a_wildcard_or_loopback() -> None:
    """What the start-up lines print instead of a placeholder."""
    found = lan_address()
    if found is not None:
        assert not is_wildcard(found)
        try:
            assert not ipaddress.ip_address(found).is_loopback
        except ValueError:
            pass  # the host name: no default route here


def addresses(config: Config, **ports: int) -> Addresses:
    return Addresses.of(config, lan=LAN, **ports)


def test_hosts_are_told_a_usable_mcp_url_never_a_wildcard(tmp_path: Path) -> None:
    """`http://0.0.0.0:8766/mcp` was printed at start; now the LAN address, or loopback."""
    base = make_config(tmp_path, host_token="h" * 32)
    for bind in ("0.0.0.0", "::"):
        config = dataclasses.replace(base, host_listen=ListenAddress(bind, 8766))
        assert addresses(config).mcp_url == f"http://{LAN}:8766/mcp"
    local = dataclasses.replace(base, host_listen=ListenAddress("127.0.0.1", 0))
    assert addresses(local, host_port=41000).mcp_url == "http://127.0.0.1:41000/mcp"
    assert addresses(local, host_port=41000).local_host_url == "http://127.0.0.1:41000"
    v6 = dataclasses.replace(base, host_listen=ListenAddress("::", 8766))
    assert addresses(v6).local_host_url == "http://[::1]:8766"


def test_devices_are_told_public_url_else_the_lan_address(tmp_path: Path) -> None:
    """The start-up line's device URL; OTA's sure fallback stays the bind (never a guess)."""
    config = make_config(tmp_path, device_listen=ListenAddress("0.0.0.0", 8765))
    assert addresses(config).device_url == f"ws://{LAN}:8765/xiaozhi/v1/"
    assert addresses(config).device_base() == ("http", "127.0.0.1", 8765)
    public = dataclasses.replace(config, public_url="https://gw.example.net")
    assert addresses(public).device_url == "wss://gw.example.net/xiaozhi/v1/"
    assert PublicAddress(public).websocket_url() == "wss://gw.example.net/xiaozhi/v1/"
    named = dataclasses.replace(config, device_listen=ListenAddress("10.0.0.5", 0))
    assert addresses(named, device_port=40001).device_url == "ws://10.0.0.5:40001/xiaozhi/v1/"


@pytest.mark.parametrize(
    ("mode", "listen", "broker"),
    [
        ("embedded", ListenAddress("0.0.0.0", 1883), "embedded"),
        ("embedded", None, None),  # mqtt_listen = off: the embedded broker does not run
        ("external", ListenAddress("0.0.0.0", 1883), "external"),
        ("external", None, "external"),  # off only concerns the embedded listener
        ("off", ListenAddress("0.0.0.0", 1883), None),
    ],
)
def test_one_mqtt_predicate_that_ota_doctor_and_addresses_agree_on(
    tmp_path: Path, mode: str, listen: ListenAddress | None, broker: str | None
) -> None:
    """External mode with mqtt_listen = off is MQTT on: OTA offers MQTT, doctor probes it."""
    config = make_config(tmp_path, mqtt_mode=mode, mqtt_listen=listen, mqtt_host="10.0.0.9")
    assert config.mqtt_broker == broker
    ota = OtaEndpoint(config, None, None, PublicAddress(config))  # type: ignore[arg-type]
    assert ota.transport == ("mqtt" if broker else "websocket")
    endpoint = addresses(config).mqtt_endpoint
    assert (endpoint is None) == (broker is None)
    if broker == "external":
        assert endpoint == "10.0.0.9:1883"
    probes = Probes(
        tcp=lambda *_: "refused",
        listener=lambda *_: "nothing",
        writable=lambda _: None,
        exposed=lambda _: [],
    )
    found = {f.topic: f for f in diagnose(config, probes=probes)}
    said = found["MQTT broker"].message
    if broker == "external":
        assert "external broker at 10.0.0.9:1883 does not answer" in said
    elif broker is None:
        assert "MQTT is off" in said
    else:
        assert "free for the embedded broker" in said


def test_boards_are_told_the_lan_address_else_what_to_set_never_loopback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wildcard bind on a machine whose LAN address is unknown: boards are told to set
    device_url, not 127.0.0.1 (a board told that connects to itself)."""
    monkeypatch.setattr("gateway.net.addresses.lan_address", lambda: None)
    config = make_config(tmp_path, device_listen=ListenAddress("0.0.0.0", 8765))
    unknown = Addresses.of(config, lan=None)
    assert unknown.board_base() is None
    assert unknown.device_url == UNKNOWN_LAN and "set device_url" in UNKNOWN_LAN
    assert unknown.board_base("homeassistant.local") == ("http", "homeassistant.local", 8765)
    assert addresses(config).board_base() == ("http", LAN, 8765)
    loopback = dataclasses.replace(config, device_listen=ListenAddress("127.0.0.1", 8765))
    assert Addresses.of(loopback, lan=None).board_base() == ("http", "127.0.0.1", 8765)
