"""Settings (fw_config), the board choice (fw_board) and boot (fw_app) on CPython."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from device_fw import fw_config
from device_fw.fw_app import build, load_tools, make_link
from device_fw.fw_board import SimBoard, make_board
from device_fw.fw_config import DEFAULTS, check, client_id, load, merge
from device_fw.fw_link_mqtt import MqttLink
from device_fw.fw_link_ws import WsLink

UUID4 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def test_example_config_is_complete_and_valid() -> None:
    """config.example.json names only known keys and passes the checks."""
    example = json.loads((Path(fw_config.__file__).parent / "config.example.json").read_text())
    assert set(example) <= set(DEFAULTS)
    check(merge(DEFAULTS, example))


def test_settings_merge_one_level_deep_and_are_checked() -> None:
    """Nested objects keep their other defaults; bad transports and URLs are refused."""
    merged = merge(DEFAULTS, {"mqtt": {"host": "gw"}, "transport": "mqtt"})
    assert merged["mqtt"] == {**DEFAULTS["mqtt"], "host": "gw"}
    check(merged)
    for bad in ({"transport": "udp"}, {"url": "http://gw/"}, {"transport": "mqtt"}):
        with pytest.raises(ValueError, match="config: "):
            check(merge(DEFAULTS, {"url": "ws://gw/", **bad}))


def test_load_reads_fw_config_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FW_CONFIG names the file on the unix port and CPython."""
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"url": "ws://gw:8765/xiaozhi/v1/", "name": "desk"}))
    monkeypatch.setenv("FW_CONFIG", str(path))
    assert load()["name"] == "desk"


def test_client_id_is_a_uuid4_made_once_and_kept(tmp_path: Path) -> None:
    """Like stock's NVS uuid: generated at first boot, the same at the next."""
    keep = str(tmp_path / "client_id")
    first = client_id(DEFAULTS, keep)
    assert UUID4.match(first) and client_id(DEFAULTS, keep) == first
    assert client_id({**DEFAULTS, "client_id": "fixed"}, keep) == "fixed"


def test_build_wires_board_tools_extra_modules_and_link() -> None:
    """build(): the simulated board off an ESP32, its tools plus tool_dice, a WebSocket link."""
    config = check(merge(DEFAULTS, {"url": "ws://gw:8765/xiaozhi/v1/", "board": "sim",
                                    "tools": ["tool_dice"], "client_id": "c"}))  # fmt: skip
    board, server, device = build(config)
    assert isinstance(board, SimBoard) and isinstance(device.link, WsLink)
    assert server.tools[-1].name == "self.dice.roll" and server.name == "sim-esp32"
    assert device.tag == board.mac() and board.on_reboot == device.restart
    with pytest.raises(ValueError, match="already registered"):
        load_tools(server, board, "tool_dice")


def test_make_link_and_make_board_follow_the_config() -> None:
    """transport "mqtt" gives the MQTT link with our topics; off an ESP32 the board is simulated."""
    config = merge(DEFAULTS, {"transport": "mqtt", "mqtt": {"host": "gw", "prefix": "p"}})
    link = make_link(config, "AA:BB", "client-1")
    assert isinstance(link, MqttLink)
    assert (link.up, link.down, link.status) == ("p/aa:bb/up", "p/aa:bb/down", "p/aa:bb/status")
    assert isinstance(make_board(DEFAULTS), SimBoard)
