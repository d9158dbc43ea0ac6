"""device_fw on the MicroPython unix port speaks up: an alert from notify_device shows on the
board, and its event API sends MCP logging notifications (docs/events.md, docs/messages.md)."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from mcp import Client

from tests.conftest import bound, gateway
from tests.device_fw.conftest import firmware_config, running_firmware
from tests.device_fw.test_unix_port import DEVICE_ID, url_of, wait_listed
from tests.simulator.helpers import mini_gateway

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


async def test_notify_device_shows_on_the_firmware_and_beeps(tmp_path: Path) -> None:
    """A real gateway's notify_device reaches the firmware as the stock alert frame: the board
    shows it (its console says so, and ``screen`` reads it back) and beeps."""
    async with gateway(tmp_path / "gw") as run:
        config = firmware_config(DEVICE_ID, url=url_of(run.device_port))
        async with running_firmware(tmp_path / "fw", config) as firmware:
            await wait_listed(run)
            alias = run.gateway.registry.get(DEVICE_ID).alias  # type: ignore[union-attr]
            async with Client(run.mcp_url, mode="legacy") as client:
                result = await client.call_tool(
                    "notify_device",
                    {"device": alias, "message": "Kettle boiled", "emotion": "happy"},
                )
            assert not result.is_error
            shown = await firmware.expect("alert [Notice] Kettle boiled (happy)")
            screen = await firmware.command("screen")
    assert shown.startswith("I fw:")
    assert screen == "ok screen  ('Notice', 'Kettle boiled', 'happy')"


async def test_the_firmware_s_events_go_as_mcp_logging_notifications_on_the_wire(
    tmp_path: Path,
) -> None:
    """A button press and any event from the firmware's API, read off the WebSocket as sent:
    ``notifications/message`` with level, logger and data, in the mcp envelope of the session."""
    async with mini_gateway() as gw:
        config = firmware_config(DEVICE_ID, url=gw.url)
        async with running_firmware(tmp_path / "fw", config) as firmware:
            assert (await gw.recv())["type"] == "hello"
            await firmware.expect("connected, session")  # serving: events go from now on
            await firmware.command("press boot")
            pressed = await gw.recv()
            await firmware.command('event sensor.temperature {"value": 41.5, "unit": "C"}')
            reading = await gw.recv()
    assert pressed == {
        "session_id": "sess-1",
        "type": "mcp",
        "payload": {
            "jsonrpc": "2.0",
            "method": "notifications/message",
            "params": {"level": "info", "logger": "button.boot", "data": {"event": "press"}},
        },
    }
    assert reading["payload"]["params"] == {
        "level": "info", "logger": "sensor.temperature", "data": {"value": 41.5, "unit": "C"}
    }  # fmt: skip
    assert json.dumps(reading["payload"]["method"]) == '"notifications/message"'


async def test_a_button_pressed_on_the_firmware_reaches_a_host(tmp_path: Path) -> None:
    """End to end: a host's ``wait_for_event``, started before the press, returns the
    firmware's button event through a real gateway, and the device's state resource holds it."""
    async with gateway(tmp_path / "gw") as run:
        config = firmware_config(DEVICE_ID, url=url_of(run.device_port))
        async with running_firmware(tmp_path / "fw", config) as firmware:
            await wait_listed(run)
            alias = run.gateway.registry.get(DEVICE_ID).alias  # type: ignore[union-attr]
            async with (
                Client(run.mcp_url, mode="legacy") as client,
                anyio.create_task_group() as tasks,
            ):
                heard: list[dict[str, object]] = []
                returned = anyio.Event()

                async def wait() -> None:
                    args = {"device": alias, "logger": "button.boot", "timeout": 20}
                    result = await client.call_tool("wait_for_event", args)
                    assert not result.is_error, result
                    heard.append(json.loads(result.content[0].text))  # type: ignore[union-attr]
                    returned.set()

                tasks.start_soon(wait)
                with anyio.fail_after(bound(5)):  # the host's wait has begun
                    await run.gateway.events.wait_watching(3)
                await firmware.command("press boot")
                with anyio.fail_after(bound(5)):
                    await returned.wait()
                state = await client.read_resource(f"device://{alias}/state")
    assert [(e["device"], e["logger"], e["data"]) for e in heard] == [
        (alias, "button.boot", {"event": "press"})
    ]
    assert "button.boot" in state.contents[0].text  # type: ignore[union-attr]
