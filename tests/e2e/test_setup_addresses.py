"""What the dashboard's Setup page tells people to give boards and hosts (issue 42): an address
a board can reach, never loopback for a wildcard listener; under Home Assistant's ingress the
add-on's own ports on HA's host name, not HA's port 8123."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2
import pytest

from gateway.config import ListenAddress
from gateway.net import addresses
from tests.conftest import bound, gateway
from tests.e2e.ingress import ingress
from tests.e2e.test_first_hour import read_until, stop
from tests.e2e.test_stdio_and_cli import cli_env
from tests.oauth_helpers import HOST_TOKEN

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

LAN = "10.42.0.2"  # the namespace's own LAN address (a test-only range, inside it alone)
SUPERVISOR = "127.0.0.2"  # plays 172.30.32.2, the Supervisor's ingress proxy
PREFIX = "/api/hassio_ingress/abc123"
EVERYWHERE = ListenAddress("0.0.0.0", 0)  # the add-on's binds (port 0 here)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=bound(10))


@pytest.fixture
def lan_namespace() -> Iterator[str]:
    """A network namespace whose default route leaves from ``LAN``: a machine on a LAN.

    A veth pair with both ends inside it, so nothing it sends leaves the namespace. Its fresh
    port space has nothing listening: the gateway's default ports are free there.
    """
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("making a network namespace needs root and iproute2's `ip`")
    name = f"gw42-{os.getpid()}"
    _ip("netns", "add", name)
    try:
        _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", name, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
        _ip("-n", name, "addr", "add", f"{LAN}/24", "dev", "v0")
        _ip("-n", name, "addr", "add", "10.42.0.1/24", "dev", "v1")
        for link in ("v0", "v1"):
            _ip("-n", name, "link", "set", link, "up")
        _ip("-n", name, "route", "add", "default", "dev", "v0")
        yield name
    finally:
        _ip("netns", "del", name)


async def test_a_wildcard_device_listener_gives_boards_the_lan_address(
    tmp_path: Path, lan_namespace: str
) -> None:
    """Device listener on 0.0.0.0, dashboard opened on 127.0.0.1: /api/setup tells boards the
    LAN address the start log names, not 127.0.0.1 (a board told that connects to itself)."""
    env = cli_env(tmp_path, GATEWAY_DEVICE_LISTEN="0.0.0.0:8765",
                  GATEWAY_HOST_LISTEN="127.0.0.1:8766")  # fmt: skip
    inside = ["ip", "netns", "exec", lan_namespace, sys.executable]
    process = await anyio.open_process([*inside, "-m", "gateway", "serve"], env=env)
    try:
        said = "\n".join(await read_until(process, "dashboard:"))
        fetch = "import sys, urllib.request as u; print(u.urlopen(sys.argv[1]).read().decode())"
        with anyio.fail_after(bound(30)):
            done = await anyio.run_process(
                [*inside, "-c", fetch, "http://127.0.0.1:8766/api/setup"], env=env
            )
    finally:
        await stop(process)
    facts = json.loads(done.stdout)
    assert facts["websocket_url"] == f"ws://{LAN}:8765/xiaozhi/v1/"
    assert facts["ota_url"] == f"http://{LAN}:8765/xiaozhi/ota/"
    assert f"devices connect to ws://{LAN}:8765/xiaozhi/v1/" in said, said  # one address, both
    assert facts["mcp_url"] == "http://127.0.0.1:8766/mcp"  # the browser's own: loopback here


async def test_under_ingress_hosts_are_given_the_add_on_s_port_on_ha_s_name(
    tmp_path: Path,
) -> None:
    """/api/setup as the Supervisor's ingress calls it (X-Ingress-Path, X-Forwarded-Host with
    the name the browser reached HA by): the MCP URL and every host config name the add-on's
    port on that name, never HA's 8123; boards get the device port on it."""
    async with (
        gateway(
            tmp_path,
            host_token=HOST_TOKEN,
            host_ingress_peers=(SUPERVISOR,),
            device_listen=EVERYWHERE,
            host_listen=EVERYWHERE,
        ) as run,
        ingress(f"http://127.0.0.1:{run.host_port}", PREFIX, source=SUPERVISOR) as proxy,
        httpx2.AsyncClient(base_url=proxy + PREFIX, timeout=bound(10)) as browser,
    ):
        answer = await browser.get("/api/setup", headers={"Host": "homeassistant.local:8123"})
        direct = await browser.get(  # the same headers, not from the ingress peer: not believed
            f"http://127.0.0.1:{run.host_port}/api/setup",
            headers={
                "X-Ingress-Path": PREFIX,
                "X-Forwarded-Host": "homeassistant.local:8123",
                "Authorization": f"Bearer {HOST_TOKEN}",
            },  # fmt: skip
        )
    assert answer.status_code == 200, answer.text
    facts = answer.json()
    mcp_url = f"http://homeassistant.local:{run.host_port}/mcp"
    assert facts["mcp_url"] == mcp_url
    assert all(mcp_url in text for key, text in facts["configs"].items()
               if key != "claude_desktop_alone"), facts["configs"]  # fmt: skip
    assert "8123" not in json.dumps(facts)
    assert facts["websocket_url"] == f"ws://homeassistant.local:{run.device_port}/xiaozhi/v1/"
    assert "homeassistant.local" not in direct.json()["mcp_url"]


async def test_with_no_lan_address_known_boards_get_the_browser_s_name_else_what_to_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a container no LAN address of the Docker host is known: the Setup page gives boards
    the name the browser reached the gateway by, and on loopback says what to set, never
    127.0.0.1."""
    monkeypatch.setattr("gateway.net.addresses.in_container", lambda: True)
    addresses.lan_address.cache_clear()
    try:
        async with (
            gateway(
                tmp_path, device_listen=EVERYWHERE, host_allowed_hosts=("server.lan:*",)
            ) as run,
            httpx2.AsyncClient(
                base_url=f"http://127.0.0.1:{run.host_port}", timeout=bound(10)
            ) as http,
        ):
            named = (
                await http.get("/api/setup", headers={"Host": f"server.lan:{run.host_port}"})
            ).json()
            local = (await http.get("/api/setup")).json()
    finally:
        addresses.lan_address.cache_clear()
    assert named["websocket_url"] == f"ws://server.lan:{run.device_port}/xiaozhi/v1/"
    assert local["websocket_url"] == local["ota_url"] == addresses.UNKNOWN_LAN
    assert "set device_url" in addresses.UNKNOWN_LAN
