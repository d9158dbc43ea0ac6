"""device_fw on the real MicroPython unix port against a real gateway, used by an MCP client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from gateway.app import Running
from gateway.config import ListenAddress
from tests.conftest import bound, gateway
from tests.device_fw.conftest import firmware_config, running_firmware
from tests.e2e.helpers import Inbox, has_tools, until
from tests.ports import outside_ephemeral
from tests.test_mqtt_helpers import RefusingSubscriptions

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

DEVICE_ID = "02:00:00:00:f1:01"


def mcp_names(run: Running) -> dict[str, str]:
    """The device's own tool names -> the names MCP hosts see."""
    exposed = run.gateway.registry.exposed_tools()
    return {t.spec.name: t.name for t in exposed if t.device.device_id == DEVICE_ID}


async def wait_listed(run: Running) -> dict[str, str]:
    """Wait until the firmware is online with its tools listed; return their MCP names."""
    async with run.gateway.registry.changes() as changes:
        await until(changes, has_tools(run, DEVICE_ID))
    return mcp_names(run)


def url_of(port: int) -> str:
    return f"ws://127.0.0.1:{port}/xiaozhi/v1/"


async def test_firmware_tools_are_listed_and_a_set_value_reads_back(tmp_path: Path) -> None:
    """An MCP client lists the firmware's tools through the gateway, switches the LED on with
    one call and reads it back with another."""
    async with gateway(tmp_path / "gw") as run:
        config = firmware_config(DEVICE_ID, url=url_of(run.device_port))
        async with running_firmware(tmp_path / "fw", config):
            names = await wait_listed(run)
            async with Client(run.mcp_url, mode="legacy") as client:
                listed = {t.name for t in (await client.list_tools()).tools}
                before = await client.call_tool(names["self.led.get_state"], {})
                switched = await client.call_tool(names["self.led.set_power"], {"on": True})
                after = await client.call_tool(names["self.led.get_state"], {})
                status = await client.call_tool(names["self.get_device_status"], {})
    assert {names[n] for n in ("self.led.set_power", "self.adc.read", "self.relay.get_state")} <= (
        listed
    )
    device = run.gateway.registry.find(DEVICE_ID)
    assert device is not None and device.tool("self.reboot") is not None  # user-only: known,
    assert "self.reboot" not in names  # but never offered to the model
    assert json.loads(before.content[0].text) == {"on": False}
    assert not switched.is_error and switched.content[0].text == "true"
    assert json.loads(after.content[0].text) == {"on": True}
    report = json.loads(status.content[0].text)
    assert report["firmware"] == "0.1.0" and report["outputs"] == {"led": True, "relay": False}
    assert report["memory"]["used"] > 0  # gc.mem_alloc() on MicroPython


async def test_an_argument_the_schema_allows_but_the_device_refuses_gets_its_error(
    tmp_path: Path,
) -> None:
    """A colour name the firmware does not know passes the gateway's schema check (any string)
    and comes back as the device's own error, as isError."""
    async with gateway(tmp_path / "gw") as run:
        config = firmware_config(DEVICE_ID, url=url_of(run.device_port))
        async with running_firmware(tmp_path / "fw", config):
            names = await wait_listed(run)
            async with Client(run.mcp_url, mode="legacy") as client:
                refused = await client.call_tool(
                    names["self.neopixel.set_color"], {"color": "ultraviolet"}
                )
                accepted = await client.call_tool(
                    names["self.neopixel.set_color"], {"color": "#ff8000", "brightness": 50}
                )
    assert refused.is_error
    assert "Unknown colour 'ultraviolet': give #rrggbb or one of" in refused.content[0].text
    assert json.loads(accepted.content[0].text) == {"rgb": [127, 64, 0]}


async def test_a_tool_added_at_runtime_reaches_the_mcp_client_by_list_changed(
    tmp_path: Path,
) -> None:
    """Loading tool_dice on the running firmware sends tools/list_changed; the gateway lists
    again and tells its MCP client, which can then call the new tool."""
    async with gateway(tmp_path / "gw") as run:
        config = firmware_config(DEVICE_ID, url=url_of(run.device_port))
        async with running_firmware(tmp_path / "fw", config) as firmware:
            names = await wait_listed(run)
            assert "self.dice.roll" not in names
            inbox = Inbox()
            async with Client(run.mcp_url, mode="legacy", message_handler=inbox) as client:
                with anyio.fail_after(bound(5)):
                    await run.gateway.frontend.notifier.wait_for_sessions(1)
                await firmware.command("add tool_dice")
                names = mcp_names(run)
                while "self.dice.roll" not in names:  # hosts may hear of other changes first
                    await inbox.next_change()
                    names = mcp_names(run)
                listed = {t.name for t in (await client.list_tools()).tools}
                rolled = await client.call_tool(names["self.dice.roll"], {"count": 3})
    assert names["self.dice.roll"] in listed
    faces = json.loads(rolled.content[0].text)
    assert len(faces) == 3 and all(1 <= face <= 6 for face in faces)


HOLD_TOOL = """
import asyncio

from fw_mcp import Tool


def tools(board):
    async def hold(args):
        print("hold: started")
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            print("hold: cancelled")
            raise

    return [Tool("self.hold", "Waits an hour, unless cancelled.", (), hold)]
"""


async def test_a_call_that_times_out_is_cancelled_on_the_firmware(tmp_path: Path) -> None:
    """At the call timeout the gateway sends notifications/cancelled: the firmware cancels the
    tool's task, and goes on serving; the host and the audit log are told so."""
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "tool_hold.py").write_text(HOLD_TOOL)
    async with gateway(tmp_path / "gw", call_timeout=bound(1.0)) as run:
        config = firmware_config(DEVICE_ID, url=url_of(run.device_port), tools=["tool_hold"])
        async with running_firmware(tmp_path / "fw", config, tools) as firmware:
            names = await wait_listed(run)
            async with Client(run.mcp_url, mode="legacy") as client:
                held = await client.call_tool(names["self.hold"], {})
                await firmware.expect("hold: cancelled")
                after = await client.call_tool(names["self.led.get_state"], {})
    assert "hold: started" in firmware.output()
    assert held.is_error
    assert held.content[0].text.endswith("; the device was told to cancel it")
    assert json.loads(after.content[0].text) == {"on": False}
    audit = [json.loads(line) for line in (tmp_path / "gw" / "audit.log").read_text().splitlines()]
    assert [record["outcome"] for record in audit] == ["DeviceTimeout", "ok"]


async def test_firmware_reconnects_by_itself_after_a_gateway_restart(tmp_path: Path) -> None:
    """Stop the gateway, start a new one on the same port and data dir: the firmware comes back
    on its own and its tools work again."""
    port = outside_ephemeral()  # both gateways bind it: one the kernel never hands to port 0
    # Tools hidden while offline: the device coming back is then a change the test can await.
    options: dict[str, Any] = {
        "device_listen": ListenAddress("127.0.0.1", port),
        "offline_tools": "hide",
        "offline_grace": 0.0,
    }
    config = firmware_config(DEVICE_ID, url=url_of(port))
    async with running_firmware(tmp_path / "fw", config) as firmware:
        async with gateway(tmp_path / "gw", **options) as run:
            names = await wait_listed(run)
            async with Client(run.mcp_url, mode="legacy") as client:
                first = await client.call_tool(names["self.relay.set_power"], {"on": True})
            seen = len(firmware.lines)
        await firmware.expect("disconnected", start=seen)
        async with gateway(tmp_path / "gw", **options) as run:
            names = await wait_listed(run)
            async with Client(run.mcp_url, mode="legacy") as client:
                again = await client.call_tool(names["self.relay.get_state"], {})
    assert first.content[0].text == "true"
    assert json.loads(again.content[0].text) == {"on": True}  # the board kept running
    assert sum("connected, session" in line for line in firmware.lines) == 2


async def test_firmware_over_mqtt_serves_its_tools_through_the_embedded_broker(
    tmp_path: Path,
) -> None:
    """The firmware's MQTT link logs in to the gateway's own broker with its token, and an MCP
    client sets a value with one call and reads it back with another."""
    options: dict[str, Any] = {"mqtt_listen": ListenAddress("127.0.0.1", 0)}
    async with gateway(tmp_path / "gw", **options) as run:
        broker = run.gateway.broker
        assert broker is not None
        mqtt = {"host": "127.0.0.1", "port": broker.port}
        config = firmware_config(DEVICE_ID, transport="mqtt", mqtt=mqtt)
        async with running_firmware(tmp_path / "fw", config):
            names = await wait_listed(run)
            async with Client(run.mcp_url, mode="legacy") as client:
                switched = await client.call_tool(names["self.led.set_power"], {"on": True})
                state = await client.call_tool(names["self.led.get_state"], {})
    device = run.gateway.registry.find(DEVICE_ID)
    assert device is not None and device.record.transport == "mqtt"
    assert switched.content[0].text == "true"
    assert json.loads(state.content[0].text) == {"on": True}


async def test_firmware_over_mqtt_reconnects_when_its_subscription_is_refused(
    tmp_path: Path,
) -> None:
    """The broker refuses the firmware's down subscription twice (SUBACK 0x80, what a NATS node
    answers while JetStream elects after a peer died): the firmware does not stay connected and
    deaf, it reconnects and subscribes again until granted, and its tools are called."""
    options: dict[str, Any] = {"mqtt_listen": ListenAddress("127.0.0.1", 0)}
    async with gateway(tmp_path / "gw", **options) as run:
        broker = run.gateway.broker
        assert broker is not None
        async with RefusingSubscriptions(broker.port) as node:
            mqtt = {"host": "127.0.0.1", "port": node.port}
            config = firmware_config(DEVICE_ID, transport="mqtt", mqtt=mqtt)
            async with running_firmware(tmp_path / "fw", config):
                names = await wait_listed(run)
                async with Client(run.mcp_url, mode="legacy") as client:
                    switched = await client.call_tool(names["self.led.set_power"], {"on": True})
            assert node.connections == node.refusing + 1
    assert switched.content[0].text == "true"
