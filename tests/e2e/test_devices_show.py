"""``devices show DEVICE`` and the tool counts (issue 30), as a user runs the CLI."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gateway.config import DeviceOptions
from tests.conftest import gateway
from tests.e2e.helpers import listed_device
from tests.e2e.test_stdio_and_cli import cli, cli_env

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

SIM = "sim-esp32_0001"
COUNTS = "17 tools for hosts, 3 user-only"  # the simulator's tools; reboot and the like are user's


async def test_devices_show_lists_the_tools_hosts_see_and_marks_user_only_ones(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The names hosts see, who may call each, descriptions on one line cut at 60 characters;
    the same counts in the log line, the `devices` table and the dashboard's device list."""
    caplog.set_level(logging.INFO, logger="gateway.devices.registry")
    async with gateway(tmp_path / "gw") as run, listed_device(run):
        env = cli_env(tmp_path / "cli")
        url = f"http://127.0.0.1:{run.host_port}"
        code, out, err = await cli("devices", "show", SIM, "--url", url, env=env)
        assert code == 0, err
        lines = out.splitlines()
        assert lines[0].startswith(f"{SIM} (02:00:00:00:00:01): online, board sim-esp32")
        assert lines[1] == COUNTS
        rows = {line.split()[0]: line.split(maxsplit=2)[1:] for line in lines[4:]}
        assert rows[f"{SIM}_audio_speaker_set_volume"][0] == "hosts"
        assert rows[f"{SIM}_reboot"] == ["user-only", "Reboot the system"]
        status = rows[f"{SIM}_get_device_status"][1]
        assert status.startswith("Provides the real-time information") and status.endswith("...")
        assert len(status) == 60 and "\n" not in status

        code, table, _ = await cli("devices", "--url", url, env=env)
        assert code == 0 and table.splitlines()[1].endswith(COUNTS)
        assert f"device {SIM} (02:00:00:00:00:01) lists {COUNTS}" in caplog.text
        code, _, err = await cli("devices", "show", "nosuch", "--url", url, env=env)
        assert code == 1 and "unknown device 'nosuch'" in err


async def test_a_user_only_tool_the_config_offers_counts_for_hosts(tmp_path: Path) -> None:
    """Named in ``user_tools``, reboot is offered to hosts and counted with their tools; a
    denied tool is marked denied."""
    options = DeviceOptions(user_tools=("self.reboot",), deny=("self.screen.*",))
    async with gateway(tmp_path / "gw", devices={"02:00:00:00:00:01": options}) as run:
        async with listed_device(run):
            url = f"http://127.0.0.1:{run.host_port}"
            code, out, _ = await cli("devices", "show", SIM, "--url", url,
                                     env=cli_env(tmp_path / "cli"))  # fmt: skip
    lines = out.splitlines()
    assert lines[1] == "15 tools for hosts, 2 user-only, 3 denied"
    rows = {line.split()[0]: line.split()[1] for line in lines[4:]}
    assert rows[f"{SIM}_reboot"] == "hosts" and rows[f"{SIM}_screen_set_theme"] == "denied"
