"""flash, provision and monitor as a person runs them: real ptys, real MicroPython, no board."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.cli.flashing.board import explain_port_error
from tests.cli.flashing.test_image import fake_firmware
from tests.conftest import bound, program

pytestmark = pytest.mark.e2e


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        capture_output=True,
        text=True,
        timeout=bound(120),
        env=env,
        cwd=cwd,
    )


DEVICE = ["--name", "kitchen", "--token", "t0k3n", "--gateway", "ws://192.0.2.1:8765/xiaozhi/v1/"]


@pytest.fixture
def silent_port() -> Iterator[str]:
    """A serial port where nothing answers: a pty with nobody on the other end."""
    controller, device = pty.openpty()
    yield os.ttyname(device)
    os.close(controller)
    os.close(device)


def test_flash_with_no_board_on_the_port_says_so(tmp_path: Path, silent_port: str) -> None:
    """A port where no chip answers gives one sentence on what to do, no traceback."""
    firmware = tmp_path / "ESP32_GENERIC.bin"
    firmware.write_bytes(fake_firmware("esp32"))
    done = cli("flash", "--port", silent_port, "--firmware", str(firmware), *DEVICE)
    assert done.returncode == 1
    assert "no chip answered on" in done.stderr and "BOOT" in done.stderr
    assert "Traceback" not in done.stderr


def test_flash_to_a_missing_port_says_so(tmp_path: Path) -> None:
    """A port that does not exist is named, with how to find the right one."""
    firmware = tmp_path / "fw.bin"
    firmware.write_bytes(fake_firmware("esp32s3"))
    done = cli("flash", "--port", "/dev/ttyUSB97", "--firmware", str(firmware), *DEVICE)
    assert done.returncode == 1 and "no such port /dev/ttyUSB97" in done.stderr


def test_flash_refuses_a_file_that_is_not_firmware(tmp_path: Path, silent_port: str) -> None:
    """A file that is no ESP image is refused before any port is touched."""
    firmware = tmp_path / "firmware.bin"
    firmware.write_text("<html>404</html>")
    done = cli("flash", "--port", silent_port, "--firmware", str(firmware), *DEVICE)
    assert done.returncode == 1 and "not an ESP firmware image" in done.stderr


def test_permission_problems_name_the_group_to_join() -> None:
    """EACCES on a port (root cannot meet it here) tells which group to join."""
    message = explain_port_error("/dev/ttyUSB0", PermissionError(13, "Permission denied"))
    assert "dialout" in message


def test_image_writes_the_merged_image_and_a_manifest(tmp_path: Path) -> None:
    """`image` needs no board: merged image plus an ESP Web Tools manifest."""
    firmware = tmp_path / "fw.bin"
    firmware.write_bytes(fake_firmware("esp32c3"))
    output = tmp_path / "kitchen.bin"
    done = cli("image", "--firmware", str(firmware), "--output", str(output), *DEVICE)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["builds"][0]["parts"] == [{"path": "kitchen.bin", "offset": 0}]
    assert output.stat().st_size == 4 * 1024 * 1024
    assert "t0k3n" not in done.stderr + done.stdout  # tokens are never shown


@pytest.fixture
def micropython_on_a_pty(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The MicroPython unix port behind a pty (socat), its working dir standing in for flash."""
    micropython, socat = program("micropython"), program("socat")
    board = tmp_path / "board"
    board.mkdir()
    port = tmp_path / "ttyMP"
    process = subprocess.Popen(
        [
            socat,
            "-d",
            "-d",
            f"PTY,link={port},raw,echo=0",
            f"EXEC:{micropython} -X heapsize=8M,pty,raw,echo=0,stderr",
        ],  # fmt: skip
        cwd=board,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    for line in process.stderr:  # socat says when both ends are up
        if "starting data transfer loop" in line:
            break
    yield str(port), board
    process.terminate()
    process.wait(timeout=bound(10))
    process.stderr.close()


def test_provision_copies_firmware_and_config_over_the_raw_repl(
    micropython_on_a_pty: tuple[str, Path],
) -> None:
    """`provision` writes device_fw (as .mpy) and config.json to a running MicroPython."""
    port, board = micropython_on_a_pty
    done = cli("provision", "--port", port, "--no-reset", *DEVICE)
    assert done.returncode == 0, done.stderr
    config = json.loads((board / "config.json").read_text())
    assert config["name"] == "kitchen" and config["token"] == "t0k3n"
    assert config["url"] == "ws://192.0.2.1:8765/xiaozhi/v1/"
    assert (board / "main.py").is_file() and (board / "fw_mcp.mpy").is_file()
