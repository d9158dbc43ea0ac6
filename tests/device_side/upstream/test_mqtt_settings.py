"""The upstream's mqtt section: read as stock firmware reads it, rewritten, kept per device."""

from __future__ import annotations

import re
import stat
from pathlib import Path
from typing import Any

import pytest

from gateway.device_side.upstream.mqtt_settings import (
    MqttUpstreams,
    device_mqtt_section,
    parse_upstream_mqtt,
)
from gateway.device_side.upstream.settings import UpstreamSettingsError

# What xiaozhi.me answers (voice-servers.md): no port (TLS on 8883), subscribe_topic "null".
XIAOZHI_ME: dict[str, Any] = {
    "endpoint": "mqtt.xiaozhi.me",
    "client_id": "GID_test@@@aa_bb_cc_dd_ee_ff@@@7b94d69a-9808-4c59-9c9b-704333b38aff",
    "username": "eyJpcCI6IjEuMi4zLjQifQ==",
    "password": "upstream-password",
    "publish_topic": "device-server",
    "subscribe_topic": "null",
}
SELF_HOSTED: dict[str, Any] = {
    "endpoint": "192.168.1.9:1883",
    "client_id": "GID_default@@@aa_bb_cc_dd_ee_ff@@@aa_bb_cc_dd_ee_ff",
    "username": "u",
    "password": "p",
    "publish_topic": "device-server",
    "subscribe_topic": "devices/p2p/aa_bb_cc_dd_ee_ff",
    "keepalive": 120,
}
OURS = {
    "endpoint": "192.168.1.5:1883",
    "client_id": "aa:bb:cc:dd:ee:ff",
    "username": "aa:bb:cc:dd:ee:ff",
    "password": "gateway-issued",
    "publish_topic": "xiaozhi/aa:bb:cc:dd:ee:ff/up",
    "keepalive": 240,
}


def test_xiaozhi_me_means_tls_on_8883_and_no_subscription() -> None:
    settings = parse_upstream_mqtt(XIAOZHI_ME)
    assert (settings.host, settings.port, settings.tls) == ("mqtt.xiaozhi.me", 8883, True)
    assert settings.subscribe_topic is None  # it pushes unasked
    assert settings.client_id == XIAOZHI_ME["client_id"] and settings.keepalive == 240
    assert "upstream-password" not in repr(settings)  # never in a log line


def test_a_self_hosted_broker_on_a_plain_port_is_subscribed_to() -> None:
    settings = parse_upstream_mqtt(SELF_HOSTED)
    assert (settings.host, settings.port, settings.tls) == ("192.168.1.9", 1883, False)
    assert settings.subscribe_topic == "devices/p2p/aa_bb_cc_dd_ee_ff"
    assert settings.keepalive == 120
    assert parse_upstream_mqtt({**SELF_HOSTED, "endpoint": "broker:8883"}).tls


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"endpoint": "broker:http"}, "not host[:port]"),
        ({"endpoint": "mqtts://broker/x"}, "not host[:port]"),
        ({"endpoint": "broker:70000"}, "not host[:port]"),
        ({"endpoint": None}, "mqtt.endpoint is missing"),
        ({"client_id": 5}, "mqtt.client_id is missing"),
        ({"publish_topic": ""}, "mqtt.publish_topic is missing"),
        ({"subscribe_topic": "devices/#"}, "not a topic name"),
        ({"password": "x" * 600}, "mqtt.password is missing or not a usable string"),
    ],
)
def test_settings_the_gateway_cannot_use_are_a_clear_error(
    change: dict[str, Any], why: str
) -> None:
    with pytest.raises(UpstreamSettingsError, match=re.escape(why)):
        parse_upstream_mqtt({**SELF_HOSTED, **change})
    with pytest.raises(UpstreamSettingsError, match="not a JSON object"):
        parse_upstream_mqtt(["endpoint"])


def test_the_device_is_pointed_at_the_gateway_and_nothing_else(tmp_path: Path) -> None:
    section = device_mqtt_section({**XIAOZHI_ME, "a_key_far_too_long_for_nvs": "x" * 300}, OURS)
    assert section == OURS  # no upstream login, topic, broker, nor anything for its NVS
    assert "subscribe_topic" not in section
    upstreams = MqttUpstreams(tmp_path)
    assert upstreams.device_section(XIAOZHI_ME, OURS) == OURS
    with pytest.raises(UpstreamSettingsError, match="endpoint"):
        upstreams.device_section({**XIAOZHI_ME, "endpoint": "a:b"}, OURS)
    upstreams.keep("AA:BB:CC:DD:EE:FF", XIAOZHI_ME)
    assert upstreams.get("aa:bb:cc:dd:ee:ff") == parse_upstream_mqtt(XIAOZHI_ME)
    upstreams.keep("aa:bb:cc:dd:ee:ff", None)
    assert upstreams.get("aa:bb:cc:dd:ee:ff") is None


def test_the_store_keeps_settings_across_restarts_privately(tmp_path: Path) -> None:
    store = MqttUpstreams(tmp_path)
    settings = parse_upstream_mqtt(XIAOZHI_ME)
    store.put("aa:bb:cc:dd:ee:ff", settings)
    path = tmp_path / "upstream_mqtt.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # it holds the upstream's password
    written = path.stat().st_mtime_ns
    store.put("aa:bb:cc:dd:ee:ff", parse_upstream_mqtt(XIAOZHI_ME))  # the next boot: same
    assert path.stat().st_mtime_ns == written
    again = MqttUpstreams(tmp_path)
    assert again.get("aa:bb:cc:dd:ee:ff") == settings
    again.put("aa:bb:cc:dd:ee:ff", None)
    assert MqttUpstreams(tmp_path).get("aa:bb:cc:dd:ee:ff") is None


def test_an_unreadable_store_costs_a_warning_not_the_gateway(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "upstream_mqtt.json").write_text("{not json")
    assert MqttUpstreams(tmp_path).get("aa:bb:cc:dd:ee:ff") is None
    (tmp_path / "upstream_mqtt.json").write_text('{"aa:bb:cc:dd:ee:ff": {"host": "x"}}')
    assert MqttUpstreams(tmp_path).get("aa:bb:cc:dd:ee:ff") is None
    assert "unreadable" in caplog.text
