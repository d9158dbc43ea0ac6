"""Tests for gateway.host_side.dashboard.host_configs: each host's config, with a host token."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from gateway.host_side.dashboard import host_configs as module
from gateway.host_side.dashboard.host_configs import HOSTS, host_configs

URL = "http://gw.lan:8766/mcp"
BEARER = {"Authorization": "Bearer <host token>"}


def test_with_a_host_token_every_config_carries_a_placeholder_for_it() -> None:
    """Headers where the host takes them, an env var where it reads one (Codex, the relay)."""
    configs = host_configs(URL, True, Path("/data"))
    assert [key for key, _, _ in HOSTS] == list(configs)
    relay = json.loads(configs["claude_desktop"])["mcpServers"]["esp32"]
    assert relay["env"] == {"GATEWAY_HOST_TOKEN": "<host token>"}
    assert json.loads(configs["cursor"])["mcpServers"]["esp32"]["headers"] == BEARER
    assert json.loads(configs["vscode"])["servers"]["esp32"]["headers"] == BEARER
    assert json.loads(configs["gemini"])["mcpServers"]["esp32"]["headers"] == BEARER
    codex = tomllib.loads(configs["codex"])["mcp_servers"]["esp32"]
    assert codex == {"url": URL, "bearer_token_env_var": "GATEWAY_HOST_TOKEN"}
    assert configs["claude_code"].endswith('--header "Authorization: Bearer <host token>"')


def test_in_our_image_the_desktop_runs_its_own_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """The container's paths mean nothing on the desktop: uvx runs the relay there."""
    monkeypatch.setattr(module, "in_container", lambda: True)
    relay = json.loads(host_configs(URL, False, Path("/data"))["claude_desktop"])
    entry = relay["mcpServers"]["esp32"]
    assert (entry["command"], entry["args"]) == ("uvx", ["esp-mcp-gateway", "stdio", "--connect",
                                                         URL])  # fmt: skip
