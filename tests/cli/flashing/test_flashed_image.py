"""The closest this machine gets to a flashed board: real MicroPython booting our image."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client

from gateway.app import Running
from gateway.cli.flashing.image import APP_OFFSETS, VFS_OFFSET
from tests.cli.flashing.test_image import HERE, fake_firmware
from tests.conftest import bound, gateway, program
from tests.e2e.helpers import until

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


def enrolled_device_ready(run: Running) -> bool:
    device = run.gateway.registry.find("desk")
    return device is not None and device.online and bool(device.tools)


async def test_firmware_booted_from_the_image_serves_its_tools(tmp_path: Path) -> None:
    """`image` registers the board and builds its flash; MicroPython mounts the filesystem
    part, boots device_fw from it, and an MCP client calls its tools through the gateway."""
    micropython = program("micropython")
    async with gateway(tmp_path / "gw") as run:
        firmware, output = tmp_path / "ESP32_GENERIC.bin", tmp_path / "desk.bin"
        firmware.write_bytes(fake_firmware("esp32"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        with anyio.fail_after(bound(120)):
            built = await anyio.run_process(
                [sys.executable, "-m", "gateway", "image", "--firmware", str(firmware),
                 "--output", str(output), "--name", "desk",
                 "--api", f"http://127.0.0.1:{run.host_port}",
                 "--gateway", f"ws://127.0.0.1:{run.device_port}/xiaozhi/v1/"],
                env=env, check=False,
            )  # fmt: skip
        assert built.returncode == 0, built.stderr.decode()
        image = tmp_path / "vfs.bin"
        image.write_bytes(output.read_bytes()[VFS_OFFSET - APP_OFFSETS["esp32"] :])
        async with run.gateway.registry.changes() as changes:
            board = await asyncio.create_subprocess_exec(
                micropython, "-X", "heapsize=8M", str(HERE / "mount_lfs.py"), str(image), "boot",
                env={**env, "MICROPYPATH": ".frozen"},
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
            try:
                await until(changes, lambda: enrolled_device_ready(run))
                async with Client(run.mcp_url, mode="legacy") as client:
                    switched = await client.call_tool("desk_led_set_power", {"on": True})
                    state = await client.call_tool("desk_led_get_state", {})
            finally:
                board.terminate()
                await board.wait()
    assert not switched.is_error
    assert json.loads(state.content[0].text) == {"on": True}
