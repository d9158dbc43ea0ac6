"""The start-up lines (issue 30): the token hint fits how the gateway was started, and cluster
mode does not claim the embedded broker."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gateway import launch
from gateway.cli.commands import announcement
from gateway.config import Config, ListenAddress
from gateway.net.addresses import Addresses


def lines(config: Config, **kwargs: bool) -> str:
    return "\n".join(announcement(config, Addresses.of(config), **kwargs))


def test_a_desktop_app_is_pointed_at_the_dashboard_not_a_command(tmp_path: Path) -> None:
    """Under Claude Desktop (stdio, the .mcpb) there is no shell to type into: the Setup page."""
    said = lines(Config(data_dir=tmp_path), desktop=True)
    assert "the dashboard's Setup page shows it: http://127.0.0.1:8766/#setup" in said
    assert "-m gateway token" not in said


def test_inside_our_image_the_token_command_goes_through_docker_compose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The container's start log names the command a Docker user runs on the server."""
    monkeypatch.setattr(launch, "in_container", lambda: True)
    said = lines(Config(data_dir=tmp_path))
    assert "(`docker compose exec gateway esp-mcp-gateway token` prints it)" in said


def test_a_home_assistant_add_on_is_pointed_at_the_dashboard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The add-on's user has the dashboard (ingress), not a shell."""
    monkeypatch.setenv("SUPERVISOR_TOKEN", "supervisor-given")
    assert "the dashboard's Setup page shows it" in lines(Config(data_dir=tmp_path))


def test_elsewhere_the_command_runs_as_typed(tmp_path: Path) -> None:
    """Not on PATH (the tests run as ``python -m pytest``): this Python with ``-m gateway``."""
    assert f"(`{sys.executable} -m gateway token` prints it)" in lines(Config(data_dir=tmp_path))


def test_cluster_mode_names_the_cluster_broker_not_the_embedded_one(tmp_path: Path) -> None:
    """With [cluster] on, the embedded broker stays off, and the log says where MQTT goes."""
    config = Config(data_dir=tmp_path, mqtt_listen=ListenAddress("0.0.0.0", 1883),
                    cluster_broker="mqtt://emqx:1883",
                    mqtt_public_endpoint="192.0.2.10:1883")  # fmt: skip
    said = lines(config)
    assert "embedded" not in said
    assert "MQTT devices use the cluster broker; stock devices are told 192.0.2.10:1883" in said


def test_the_remote_url_and_a_former_setting_name_are_said(tmp_path: Path) -> None:
    """With [host] remote_url the start log says where remote apps connect; a setting given
    under its former name is named with its new one, once."""
    config = Config(data_dir=tmp_path, host_public_url="https://devices.example.com",
                    renamed=("GATEWAY_PUBLIC_URL is now GATEWAY_DEVICE_URL",))  # fmt: skip
    said = lines(config).splitlines()
    assert "remote apps (claude.ai, ChatGPT) connect to https://devices.example.com/mcp" in said
    assert (
        said.count("GATEWAY_PUBLIC_URL is now GATEWAY_DEVICE_URL (the former name still works)")
        == 1
    )
    assert not any("remote apps" in line for line in lines(Config(data_dir=tmp_path)).splitlines())
