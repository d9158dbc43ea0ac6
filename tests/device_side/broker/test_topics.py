"""Topic names and per-device passwords: the pure parts of the MQTT contract."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from gateway.device_side.broker import DeviceCredentials, Topics, is_device_id


def test_topics_follow_the_contract() -> None:
    """up/down under the prefix, with the lower-case MAC as device id; status of every device."""
    topics = Topics()
    device = "aa:bb:cc:dd:ee:ff"
    assert topics.up(device) == "xiaozhi/aa:bb:cc:dd:ee:ff/up"
    assert topics.down(device) == "xiaozhi/aa:bb:cc:dd:ee:ff/down"
    assert topics.every("up") == "xiaozhi/+/up"
    assert topics.every("status") == "xiaozhi/+/status"


@pytest.mark.parametrize(
    ("topic", "parsed"),
    [
        ("home/xz/aa:bb/up", ("aa:bb", "up")),
        ("home/xz/aa:bb/status", ("aa:bb", "status")),
        ("home/xz/aa:bb/down", ("aa:bb", "down")),
        ("home/xz/aa:bb/sideways", None),
        ("home/xz/AA:BB/up", None),
        ("home/xz/aa/bb/up", None),
        ("home/xz/up", None),
        ("other/aa:bb/up", None),
        ("home/xz/@esp-mcp-gateway/up", None),
    ],
)
def test_parse_accepts_only_device_topics(topic: str, parsed: tuple[str, str] | None) -> None:
    """Anything but <prefix>/<device-id>/<kind> is not a device topic."""
    assert Topics("home/xz").parse(topic) == parsed


def test_device_ids_are_topic_safe() -> None:
    """No wildcards, separators, upper case or the gateway's login in a device id."""
    assert is_device_id("aa:bb:cc:dd:ee:ff") and is_device_id("esp32-01_a.b")
    for bad in ("", "a/b", "a+b", "a#", "AA:BB", "@gw", "x" * 65, None, 3):
        assert not is_device_id(bad), bad


def test_device_passwords_are_per_device_and_stable(tmp_path: Path) -> None:
    """Derived passwords differ per device and Client-Id, survive a restart, admit only theirs."""
    first = DeviceCredentials(tmp_path)
    password = first.password_for("aa:bb:cc:dd:ee:ff", "uuid-1")
    assert len(password) == 32 and password != first.password_for("aa:bb:cc:dd:ee:00", "uuid-1")
    assert password != first.password_for("aa:bb:cc:dd:ee:ff", "uuid-2")  # another check-in
    again = DeviceCredentials(tmp_path)
    assert again.password_for("AA:BB:CC:DD:EE:FF", "uuid-1") == password
    assert again.admits("aa:bb:cc:dd:ee:ff", "uuid-1", password)
    assert not again.admits("aa:bb:cc:dd:ee:00", "uuid-1", password)
    assert not again.admits("aa:bb:cc:dd:ee:ff", "uuid-2", password)
    mode = (tmp_path / "mqtt_secret").stat().st_mode
    assert stat.S_IMODE(mode) == 0o600


def test_deleting_the_secret_revokes_every_password(tmp_path: Path) -> None:
    """A new secret means new passwords (devices get them at their next OTA check-in)."""
    password = DeviceCredentials(tmp_path).password_for("aa:bb", None)
    (tmp_path / "mqtt_secret").unlink()
    assert not DeviceCredentials(tmp_path).admits("aa:bb", None, password)
