"""The CLI as users run it: subprocesses for stdio MCP, the stdio relay, and the commands."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from gateway.app import Running
from gateway.simulator import SimulatedDevice
from tests.conftest import DEVICE_TOKEN, bound, gateway
from tests.e2e.helpers import Inbox, listed_device, until
from tests.ports import outside_ephemeral, refusing_port

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

SIMULATED = [f"sim-esp32_{n:04d}" for n in range(1, 6)]  # `simulate --count 5`


def cli_env(data_dir: Path, **extra: str) -> dict[str, str]:
    # As a user runs it: no GATEWAY_ settings of the test run, and no asyncio debug mode (CI's
    # PYTHONASYNCIODEBUG), which writes lines of its own to the stderr these tests read.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GATEWAY_") and k != "PYTHONASYNCIODEBUG"
    }
    env.update(GATEWAY_DATA_DIR=str(data_dir), GATEWAY_MQTT_LISTEN="off", **extra)
    return env


async def cli(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    with anyio.fail_after(bound(30)):
        done = await anyio.run_process(
            [sys.executable, "-m", "gateway", *args], env=env, check=False
        )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def stdio_gateway(data_dir: Path) -> tuple[StdioServerParameters, str]:
    """`esp-mcp-gateway stdio` as an MCP host starts it, and its device WebSocket URL."""
    # The host starts it, so its log is not ours to read for a port 0's: the device port is one
    # the kernel never hands out for port 0 (tests/ports.py).
    device_port = outside_ephemeral()
    env = cli_env(
        data_dir,
        GATEWAY_DEVICE_LISTEN=f"127.0.0.1:{device_port}",
        GATEWAY_HOST_LISTEN="127.0.0.1:0",
        GATEWAY_DEVICE_TOKEN=DEVICE_TOKEN,
    )
    params = StdioServerParameters(command=sys.executable, args=["-m", "gateway", "stdio"], env=env)
    return params, f"ws://127.0.0.1:{device_port}/xiaozhi/v1/"


async def test_stdio_serves_mcp_and_the_device_listener(tmp_path: Path) -> None:
    """`esp-mcp-gateway stdio` (Claude Desktop's entry) lists, pushes changes and calls."""
    params, url = stdio_gateway(tmp_path)
    inbox = Inbox()
    async with Client(params, mode="legacy", message_handler=inbox) as client:
        assert client.server_info.name == "esp-mcp-gateway"
        assert [t.name for t in (await client.list_tools()).tools] == [
            "list_devices",
            "call_device_tool",
            "wait_for_event",
            "notify_device",
        ]
        async with SimulatedDevice(url, DEVICE_TOKEN, device_id="02:00:00:00:00:01"):
            await inbox.next_change()
            names = [t.name for t in (await client.list_tools()).tools]
            assert "sim-esp32_0001_lamp_turn_on" in names
            result = await client.call_tool("sim-esp32_0001_lamp_turn_on", {})
            assert not result.is_error and result.content[0].text == "true"


async def test_stdio_connect_relays_to_a_running_gateway(tmp_path: Path) -> None:
    """`stdio --connect URL --token T` reaches a gateway elsewhere, pushes included."""
    async with gateway(tmp_path / "gw", host_token="host-secret") as run:
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "gateway", "stdio", "--connect", run.mcp_url, "--token", "host-secret"],
            env=cli_env(tmp_path / "relay"),
        )
        inbox = Inbox()
        async with Client(params, mode="legacy", message_handler=inbox) as client:
            assert client.server_info.name == "esp-mcp-gateway"
            with anyio.fail_after(bound(10)):
                await run.gateway.frontend.notifier.wait_for_sessions(1)
            async with listed_device(run):
                await inbox.next_change()
                result = await client.call_tool("sim-esp32_0001_lamp_turn_on", {})
    assert not result.is_error and result.content[0].text == "true"


async def test_devices_and_call_commands(tmp_path: Path) -> None:
    """`devices` prints a table of a running gateway; `call` calls a tool and prints its text."""
    async with gateway(tmp_path / "gw") as run, listed_device(run):
        env = cli_env(tmp_path / "cli")
        url = f"http://127.0.0.1:{run.host_port}"
        code, table, _ = await cli("devices", "--url", url, env=env)
        assert code == 0
        header, row = table.splitlines()
        assert header.split()[:3] == ["DEVICE", "ID", "STATE"]
        assert row.split()[:3] == ["sim-esp32_0001", "02:00:00:00:00:01", "online"]
        code, out, _ = await cli(
            "call", "--url", url, "sim-esp32_0001", "self.audio_speaker.set_volume",
            '{"volume": 42}', env=env,
        )  # fmt: skip
        assert (code, out.strip()) == (0, "true")
        code, out, _ = await cli(
            "call", "--url", url, "sim-esp32_0001", "self.get_device_status", env=env
        )
        assert json.loads(out)["audio_speaker"]["volume"] == 42
        code, _, err = await cli("call", "--url", url, "nosuch", "x", env=env)
        assert code == 1 and "unknown device 'nosuch'" in err


async def test_cli_reports_an_unreachable_gateway_in_one_line(tmp_path: Path) -> None:
    """No traceback when nothing listens at the URL."""
    with refusing_port() as nothing_there:
        code, _, err = await cli(
            "devices", "--url", f"http://127.0.0.1:{nothing_there}", env=cli_env(tmp_path)
        )
    assert code == 1
    assert "cannot reach the gateway" in err and "Traceback" not in err


async def test_token_is_generated_once_and_kept(tmp_path: Path) -> None:
    """`token` makes a device token at first use and prints the same one afterwards."""
    env = cli_env(tmp_path)
    first = await cli("token", env=env)
    second = await cli("token", env=env)
    assert first[0] == 0 and len(first[1].strip()) >= 24
    assert first[1] == second[1]
    assert oct((tmp_path / "device_token").stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize(
    ("content", "key"),
    [
        ('tools = { mode = "everything" }', "tools.mode"),
        ("device_listen = 8765", "device_listen"),
        ("[calls]\ntimeout = -1", "calls.timeout"),
        ("this is = not toml [", "not valid TOML"),
        ("colour = 1", "colour"),
    ],
)
async def test_broken_config_gives_one_clear_message(
    tmp_path: Path, content: str, key: str
) -> None:
    """A broken config file names the key, exits 2, and shows no traceback."""
    config = tmp_path / "gateway.toml"
    config.write_text(content)
    code, _, err = await cli("check-config", "--config", str(config), env=cli_env(tmp_path))
    assert code == 2
    assert key in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


async def test_non_loopback_host_listener_needs_a_token(tmp_path: Path) -> None:
    """Binding the MCP side off loopback without a host token refuses to start."""
    env = cli_env(tmp_path, GATEWAY_HOST_LISTEN="0.0.0.0:0", GATEWAY_DEVICE_LISTEN="127.0.0.1:0")
    code, _, err = await cli("serve", env=env)
    assert code == 2 and "GATEWAY_HOST_TOKEN" in err


async def test_devices_forget_removes_a_device_for_good(tmp_path: Path) -> None:
    """`devices forget` drops the device, its tools and its names, also after a restart."""
    async with gateway(tmp_path / "gw") as run, listed_device(run):
        env = cli_env(tmp_path / "cli")
        url = f"http://127.0.0.1:{run.host_port}"
        registry = run.gateway.registry
        first_seen = registry.find("sim-esp32_0001").record.first_seen  # type: ignore[union-attr]
        async with registry.changes() as changes:
            code, out, _ = await cli("devices", "forget", "sim-esp32_0001", "--url", url, env=env)
            assert code == 0 and "forgot sim-esp32_0001 (02:00:00:00:00:01)" in out
            await until(changes, lambda: registry.find("02:00:00:00:00:01") is None)
        assert not registry.exposed_tools()
        code, _, err = await cli("devices", "forget", "sim-esp32_0001", "--url", url, env=env)
        assert code == 1 and "unknown device" in err
    async with gateway(tmp_path / "gw") as run:
        assert run.gateway.registry.find("02:00:00:00:00:01") is None
        async with listed_device(run):  # it comes back: a new device
            again = run.gateway.registry.find("02:00:00:00:00:01")
            assert again is not None and again.record.first_seen > first_seen


def all_simulated_listed(run: Running) -> Callable[[], bool]:
    """A condition: the five simulated devices are online and hosts see their tools."""
    registry = run.gateway.registry

    def check() -> bool:
        listed = {t.device.alias for t in registry.exposed_tools() if t.device.online}
        return listed == set(SIMULATED)

    return check


async def test_simulate_count_five_then_a_new_session_lists_device_tools(tmp_path: Path) -> None:
    """`simulate --count 5`: a host session opened afterwards finds their tools, not meta only."""
    async with gateway(tmp_path / "gw") as run:
        args = ["simulate", "--url", run.device_url, "--token", DEVICE_TOKEN, "--count", "5"]
        log = tmp_path / "simulate.log"
        with log.open("wb") as output:
            process = await anyio.open_process(
                [sys.executable, "-m", "gateway", *args],
                env=cli_env(tmp_path / "cli"), stdout=output, stderr=output,
            )  # fmt: skip
            try:
                async with run.gateway.registry.changes() as changes:
                    await until(changes, all_simulated_listed(run))
                async with Client(run.mcp_url, mode="legacy") as client:
                    result = await client.list_tools()
                mode = run.gateway.frontend.lister.current().mode
            finally:
                process.send_signal(signal.SIGTERM)  # it runs until stopped, like `serve`
                with anyio.fail_after(bound(10)):
                    code = await process.wait()
                await process.aclose()
    assert code == 0, log.read_text()
    names = [t.name for t in result.tools]
    assert result.next_cursor is None
    meta = ["list_devices", "call_device_tool", "wait_for_event", "notify_device"]
    assert names[:4] == meta and len(names) > 4
    assert mode == "per-device"  # 5 x 17 tools fit the default budget of 128
    lamps = {name.removesuffix("_lamp_turn_on") for name in names if name.endswith("_lamp_turn_on")}
    assert lamps == set(SIMULATED)
