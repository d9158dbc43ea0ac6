"""The first hour of a new user (issue 14): each test repeats a step that used to trip them up.

The CLI runs as users run it, a subprocess (``python -m gateway``); the gateways it talks to are
real ones on free ports.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream

from gateway.app import Running
from gateway.config import ListenAddress
from gateway.devices.device import Device
from tests.conftest import bound, gateway
from tests.e2e.helpers import until
from tests.e2e.test_stdio_and_cli import cli, cli_env
from tests.ports import outside_ephemeral  # the ports these compare with what serve says

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

SDK_MODULES = re.compile(r"\|\s+(mcp|mcp_types|httpx2|uvicorn|starlette)(\.|$)")


async def read_until(process: Process, done: str, limit: float = 30) -> list[str]:
    """The process's stderr lines up to and including the first one containing ``done``."""
    assert process.stderr is not None
    lines, buffer = [], ""
    with anyio.fail_after(bound(limit)):
        async for chunk in TextReceiveStream(process.stderr):
            buffer += chunk
            *complete, buffer = buffer.split("\n")
            lines += complete
            if any(done in line for line in complete):
                return lines
    raise AssertionError(f"exited before {done!r}:\n" + "\n".join(lines) + buffer)


async def stop(process: Process) -> int:
    process.send_signal(signal.SIGTERM)
    with anyio.fail_after(bound(10)):
        code = await process.wait()
    await process.aclose()
    return code


# --- item 7: start-up output and start-up time -------------------------------------------------


async def test_token_does_not_import_the_mcp_sdk(tmp_path: Path) -> None:
    """`token` (and the CLI's other small commands) start without the SDK, uvicorn, starlette."""
    env = cli_env(tmp_path)
    with anyio.fail_after(bound(30)):
        done = await anyio.run_process(
            [sys.executable, "-X", "importtime", "-m", "gateway", "token"], env=env, check=False
        )
    assert done.returncode == 0 and done.stdout.decode().strip()
    heavy = SDK_MODULES.findall(done.stderr.decode())
    assert not heavy, f"`token` imported {sorted({m for m, _ in heavy})}"


async def test_serve_says_where_to_connect_in_usable_addresses(tmp_path: Path) -> None:
    """Ours come first; no wildcard URL, no placeholder, a token command that runs as typed."""
    device, host = outside_ephemeral(), outside_ephemeral()
    env = cli_env(
        tmp_path,
        GATEWAY_DEVICE_LISTEN=f"0.0.0.0:{device}",
        GATEWAY_HOST_LISTEN=f"0.0.0.0:{host}",
        GATEWAY_HOST_TOKEN="a-long-enough-host-token-for-tests",
    )
    process = await anyio.open_process([sys.executable, "-m", "gateway", "serve"], env=env)
    try:
        lines = await read_until(process, "dashboard:")
    finally:
        code = await stop(process)
    assert code == 0
    said = "\n".join(lines)
    assert not any(" mcp." in line or " httpx" in line for line in lines), said
    assert "0.0.0.0" not in said and "<" not in said, said
    assert f"{sys.executable} -m gateway token" in said, said  # not on PATH here: how it ran
    urls = re.findall(r"(?:ws|http)://([^/\s]+)/", said)
    # The device listener, MCP, then the dashboard on the host listener.
    assert [u.rsplit(":", 1)[1] for u in urls] == [str(device), str(host), str(host)], said


async def test_serve_with_a_loopback_host_listener_prints_a_loopback_mcp_url(
    tmp_path: Path,
) -> None:
    """The default: hosts on this machine, at 127.0.0.1."""
    host = outside_ephemeral()
    env = cli_env(
        tmp_path,
        GATEWAY_DEVICE_LISTEN="127.0.0.1:0",
        GATEWAY_HOST_LISTEN=f"127.0.0.1:{host}",
    )
    process = await anyio.open_process([sys.executable, "-m", "gateway", "serve"], env=env)
    try:
        lines = await read_until(process, "MCP hosts connect to")
    finally:
        await stop(process)
    assert f"MCP hosts connect to http://127.0.0.1:{host}/mcp" in "\n".join(lines)


async def simulate_until(
    run: Running, condition: Callable[[Device], bool], *args: str, env: dict[str, str]
) -> int:
    """Run `simulate ARGS` until a device of ``run`` meets ``condition``; its exit status."""
    command = [sys.executable, "-m", "gateway", "simulate", *args]
    process = await anyio.open_process(command, env=env)
    try:
        registry = run.gateway.registry
        async with registry.device_changes() as changes:
            await until(changes, lambda: any(condition(d) for d in registry.devices()))
    finally:
        code = await stop(process)
    return code


# --- item 1: a device token beginning with "-" --------------------------------------------------


async def test_simulate_takes_a_token_that_begins_with_a_dash(tmp_path: Path) -> None:
    """`simulate --token "$(esp-mcp-gateway token)"` with a token an older version made."""
    token = "-Jc5vJq1F2ZFQ0nTnx1Y8cS0f3Ke2vX9"
    async with gateway(tmp_path / "gw", device_tokens=(token,)) as run:
        args = ["--url", run.device_url, "--token", token]
        code = await simulate_until(run, lambda d: d.online, *args, env=cli_env(tmp_path / "cli"))
    assert code == 0


# --- item 3: ports already taken -----------------------------------------------------------------


def only_one_message(err: str) -> str:
    """The CLI's one line (warnings about the machine aside), and no traceback."""
    assert "Traceback" not in err, err
    said = [line for line in err.splitlines() if line.startswith("esp-mcp-gateway:")]
    assert len(said) == 1, err
    return said[0]


async def test_serve_with_the_mqtt_port_taken_says_what_to_do(tmp_path: Path) -> None:
    """A mosquitto on 1883 (here a socket on a free port): one sentence naming the fixes."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        env = cli_env(
            tmp_path, GATEWAY_DEVICE_LISTEN="127.0.0.1:0", GATEWAY_HOST_LISTEN="127.0.0.1:0"
        )
        env["GATEWAY_MQTT_LISTEN"] = f"127.0.0.1:{port}"
        code, _, err = await cli("serve", env=env)
    said = only_one_message(err)
    assert code == 1
    assert f"port {port}" in said and "--mqtt-listen off" in said
    assert '[mqtt] mode = "external"' in said


async def test_stdio_beside_a_running_serve_names_stdio_connect(tmp_path: Path) -> None:
    """Claude Desktop's `stdio` entry while `serve` holds the ports: use the running gateway."""
    device, host = outside_ephemeral(), outside_ephemeral()
    listen = {
        "device_listen": ListenAddress("127.0.0.1", device),
        "host_listen": ListenAddress("127.0.0.1", host),
    }
    async with gateway(tmp_path / "gw", **listen):
        env = cli_env(
            tmp_path / "stdio",
            GATEWAY_DEVICE_LISTEN=f"127.0.0.1:{device}",
            GATEWAY_HOST_LISTEN=f"127.0.0.1:{host}",
        )
        code, _, err = await cli("stdio", env=env)
    said = only_one_message(err)
    assert code == 1 and f"port {device}" in said
    assert f"`stdio --connect http://127.0.0.1:{host}/mcp`" in said


# --- item 4: a data dir the gateway cannot use ---------------------------------------------------

# Root writes into a mode-0500 dir regardless: without these capabilities it cannot (CI runs as
# root, and setpriv comes with util-linux, which every Debian has).
AS_A_USER = (
    ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
)


async def cli_as_a_user(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    with anyio.fail_after(bound(30)):
        done = await anyio.run_process(
            [*AS_A_USER, sys.executable, "-m", "gateway", *args], env=env, check=False
        )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


@pytest.mark.parametrize("command", ["token", "serve", "stdio"])
@pytest.mark.parametrize("where", ["a file", "under a file", "read-only"])
async def test_an_unusable_data_dir_is_one_sentence(
    tmp_path: Path, where: str, command: str
) -> None:
    """GATEWAY_DATA_DIR naming a file, a path under one, or a dir this user cannot write."""
    blocker = tmp_path / "afile"
    blocker.write_text("not a directory\n")
    data_dir = {"a file": blocker, "under a file": blocker / "sub", "read-only": tmp_path / "ro"}
    path = data_dir[where]
    if where == "read-only":
        path.mkdir(mode=0o500)
    env = cli_env(path, GATEWAY_DEVICE_LISTEN="127.0.0.1:0", GATEWAY_HOST_LISTEN="127.0.0.1:0")
    code, out, err = await cli_as_a_user(command, env=env)
    said = only_one_message(err)
    assert code == 2 and out == ""
    assert f"data_dir: {path}" in said or f"write in {path}" in said, said
    assert "GATEWAY_DATA_DIR" in said
    if where == "read-only":
        assert "permission denied" in said and not list(path.iterdir())


async def test_a_registry_that_cannot_be_opened_is_one_sentence(tmp_path: Path) -> None:
    """A data dir that is fine, holding a registry SQLite cannot open (here: a directory)."""
    (tmp_path / "registry.sqlite3").mkdir()
    env = cli_env(tmp_path, GATEWAY_DEVICE_LISTEN="127.0.0.1:0", GATEWAY_HOST_LISTEN="127.0.0.1:0")
    code, _, err = await cli("serve", env=env)
    said = only_one_message(err)
    assert code == 1 and f"cannot open the registry {tmp_path / 'registry.sqlite3'}" in said


# --- item 8: check-config speaks TOML -----------------------------------------------------------


async def test_check_config_prints_the_keys_of_the_toml_file(tmp_path: Path) -> None:
    """`calls.timeout`, as the file spells it, not the internal `call_timeout`."""
    config = tmp_path / "gateway.toml"
    config.write_text(
        '[calls]\ntimeout = 12\n[devices."aa:bb"]\nname = "desk"\n'
        '[cluster]\nauth_token = "broker-auth-secret-0123456789"\n'
    )
    code, out, _ = await cli("check-config", "--config", str(config), env=cli_env(tmp_path))
    assert code == 0
    assert "cluster.auth_token = (set)" in out.splitlines() and "secret-0123" not in out
    assert "calls.timeout = 12.0" in out.splitlines() and "call_timeout" not in out
    assert "mqtt.mode = embedded" in out.splitlines() and "mqtt_mode" not in out
    assert 'devices."aa:bb".name = desk' in out.splitlines()


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('host_tokn = "0123456789abcdef0123"', "did you mean 'host_token'?"),
        ("[call]\ntimeout = 5", "did you mean [calls]?"),
        ("[calls]\ntimout = 5", "did you mean 'timeout'?"),
    ],
)
async def test_a_typo_in_the_config_names_the_closest_key(
    tmp_path: Path, content: str, expected: str
) -> None:
    """A top-level typo lists every known key and suggests the closest one."""
    config = tmp_path / "gateway.toml"
    config.write_text(content)
    code, _, err = await cli("check-config", "--config", str(config), env=cli_env(tmp_path))
    said = only_one_message(err)
    assert code == 2 and expected in said
    if "[" not in content.split("\n")[0]:
        assert "known: data_dir, device_listen" in said and "[calls]" in said


async def test_a_short_host_token_is_refused(tmp_path: Path) -> None:
    """A 3-character host token was accepted silently; now it is refused with how to make one."""
    env = cli_env(tmp_path, GATEWAY_HOST_TOKEN="abc")
    code, _, err = await cli("check-config", env=env)
    said = only_one_message(err)
    assert code == 2 and "GATEWAY_HOST_TOKEN: the host token has 3 characters" in said
    assert "16 or more" in said and "secrets.token_hex" in said


# --- issue 21, item 7: `simulate` on the settings of the other commands --------------------------


async def test_simulate_finds_the_gateway_from_the_same_settings_under_one_name(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """GATEWAY_DEVICE_LISTEN and the data dir's token, as `serve` reads them: no option needed.

    The gateway's log names the device one way only: its id until it is named after its
    board, then ``sim-esp32_0001 (id)``, never the provisional ``esp32_0001``.
    """
    caplog.set_level(logging.INFO, "gateway.devices.registry")
    async with gateway(tmp_path, device_tokens=()) as run:  # the data dir's generated token
        env = cli_env(tmp_path, GATEWAY_DEVICE_LISTEN=f"127.0.0.1:{run.device_port}")
        code = await simulate_until(run, lambda d: bool(d.tools), env=env)
    assert code == 0
    said = [r.getMessage() for r in caplog.records if "02:00:00:00:00:01" in r.getMessage()]
    assert any("sim-esp32_0001 (02:00:00:00:00:01) lists" in line for line in said), said
    assert not any(re.search(r"(?<!sim-)esp32_0001", line) for line in said), said


async def test_simulate_gives_up_on_a_wrong_url_saying_why(
    tmp_path: Path, refused_port: int
) -> None:
    """Nothing listens there: after --give-up seconds, one line naming the URL and the cause."""
    url = f"ws://127.0.0.1:{refused_port}/xiaozhi/v1/"
    code, _, err = await cli("simulate", "--url", url, "--token", "t", "--give-up", "1",
                             env=cli_env(tmp_path))  # fmt: skip
    assert code == 1
    said = only_one_message(err)
    assert f"no simulated device could connect to {url} in 1 s" in said
    assert "Connect call failed" in said and "GATEWAY_DEVICE_LISTEN" in said
