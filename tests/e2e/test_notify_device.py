"""notify_device end to end: a real gateway, the MCP SDK's client over streamable HTTP, a
stock-like MQTT device on a real mosquitto and a stock-like WebSocket device, each receiving
the exact stock ``alert`` frame (reference/xiaozhi-protocol.md §1.1), and the owner's limits
refusing with reasons (docs/messages.md)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import Client

from gateway.app import Running
from gateway.config import DeviceOptions
from gateway.config.quiet import quiet_hours
from tests.conftest import bound, gateway
from tests.e2e.helpers import RawDevice, serving, until
from tests.e2e.test_mqtt import STOCK, ota_check_in, stock_device
from tests.mqtt_helpers import Mosquitto

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

HOST = types.Implementation(name="notify-test-host", version="1.0")
LAMP = {"name": "self.lamp.turn_on", "description": "Turn the lamp on.",
        "inputSchema": {"type": "object", "properties": {}}}  # fmt: skip
ALERT = [("type", "alert"), ("status", "Notice"), ("message", "Dinner is ready"),
         ("emotion", "happy")]  # fmt: skip


class ListeningDevice(RawDevice):
    """A raw stock-like WebSocket device that keeps every message that is not MCP, in order."""

    def __init__(self, device_id: str, alias: str) -> None:
        super().__init__(device_id, alias, [LAMP])
        self.others: list[dict[str, Any]] = []
        self.arrived = anyio.Event()

    async def respond(self, message: dict[str, Any]) -> dict[str, Any] | None:
        if message.get("type") not in ("mcp", "hello"):
            self.others.append(message)
            self.arrived.set()
        return await super().respond(message)

    async def next_other(self) -> dict[str, Any]:
        with anyio.fail_after(bound(5)):
            while not self.others:
                self.arrived = anyio.Event()
                await self.arrived.wait()
        return self.others.pop(0)


def text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


def notify_records(run: Running) -> list[dict[str, Any]]:
    """The audit records of notify_device, oldest first."""
    records = run.gateway.audit.page(kind="call")["records"]
    return [r for r in reversed(records) if r["tool"] == "notify_device"]


async def test_a_stock_like_mqtt_device_on_mosquitto_gets_the_exact_alert_frame(
    tmp_path: Path,
) -> None:
    """OTA check-in, MQTT on mosquitto (never subscribing: a broker that pushes its down topic,
    as EMQX's auto-subscribe does), then notify_device: the device receives the alert frame
    byte for byte, and the audit names the host that sent it."""
    async with Mosquitto(tmp_path / "mosquitto") as broker:
        external = {"mqtt_mode": "external", "mqtt_host": "127.0.0.1", "mqtt_port": broker.port,
                    "adoption": "auto", "mqtt_probe_interval": 0.2}  # fmt: skip
        async with gateway(tmp_path / "gw", **external) as run:
            reply = await ota_check_in(run)
            device = stock_device(reply)
            device.subscribe = True  # the broker's auto-subscribe, which mosquitto lacks
            registry = run.gateway.registry
            async with device, registry.device_changes() as changes:
                await until(changes, lambda: bool((d := registry.get(STOCK)) and d.online))
                alias = registry.get(STOCK).alias  # type: ignore[union-attr]
                async with Client(run.mcp_url, mode="legacy", client_info=HOST) as client:
                    result = await client.call_tool(
                        "notify_device",
                        {"device": alias, "message": "Dinner is ready", "emotion": "happy"},
                    )
                    assert not result.is_error, text(result)
                    raw = await device.wait_raw(lambda raw: b'"alert"' in raw)
    assert raw == (
        b'{"type":"alert","status":"Notice","message":"Dinner is ready","emotion":"happy"}'
    )
    [record] = notify_records(run)
    assert record["caller"] == "http:127.0.0.1 notify-test-host"
    assert (record["device_id"], record["outcome"]) == (STOCK, "ok")
    assert record["arguments"] == {"message": "Dinner is ready", "emotion": "happy"}


async def test_a_websocket_device_gets_the_alert_while_connected_and_the_limits_refuse(
    tmp_path: Path,
) -> None:
    """Over WebSocket: the exact frame while the socket is open; the rate, quiet hours (on the
    gateway's clock, set by the test), the owner's switch, a long or controlled message and a
    device that went away are each refused with their reason, and nothing more reaches the
    device; every attempt is audited with its caller."""
    lamp = ListeningDevice("aa:bb:cc:00:00:01", "lamp")
    muted = ListeningDevice("aa:bb:cc:00:00:02", "muted")
    devices = {
        lamp.device_id: DeviceOptions(name="lamp", messages_per_hour=2,
                                      quiet=quiet_hours("quiet", "22:00-07:00")),
        muted.device_id: DeviceOptions(name="muted", messages=False),
    }  # fmt: skip
    async with gateway(tmp_path, devices=devices) as run:
        messenger = run.gateway.messenger
        noon = time.mktime((2026, 12, 1, 12, 0, 0, 0, 0, -1))  # the gateway's local noon
        messenger.clock = lambda: noon

        async def notify(client: Client, device: str, message: str, **more: str) -> Any:
            return await client.call_tool(
                "notify_device", {"device": device, "message": message, **more}
            )

        async with serving(run, lamp, muted), Client(run.mcp_url, mode="legacy",
                                                      client_info=HOST) as client:  # fmt: skip
            sent = await notify(client, "lamp", "Dinner is ready", emotion="happy")
            assert not sent.is_error, text(sent)
            assert list((await lamp.next_other()).items()) == ALERT
            plain = await notify(client, "lamp", "Second")
            assert not plain.is_error
            assert list((await lamp.next_other()).items()) == [
                ("type", "alert"), ("status", "Notice"), ("message", "Second"),
                ("emotion", "neutral")]  # fmt: skip
            refusals = {
                "rate": await notify(client, "lamp", "Third"),
                "muted": await notify(client, "muted", "Hello"),
                "long": await notify(client, "lamp", "x" * 201),
                "control": await notify(client, "lamp", "ring\x07ring"),
            }
            messenger.clock = lambda: noon + 11 * 3600  # 23:00, and the hour's rate is over
            refusals["quiet"] = await notify(client, "lamp", "Late")
            messenger.clock = lambda: noon + 20 * 3600  # 08:00 the next day
            later = await notify(client, "lamp", "Morning")
            assert not later.is_error, text(later)
            assert (await lamp.next_other())["message"] == "Morning"
            async with run.gateway.registry.device_changes() as changes:
                await lamp.close()
                await until(changes, lambda: not run.gateway.registry.get(lamp.device_id).online)  # type: ignore[union-attr]
            refusals["gone"] = await notify(client, "lamp", "Anyone?")
    said = {why: (result.is_error, text(result)) for why, result in refusals.items()}
    assert said["rate"] == (True, "device lamp had 2 messages in the last hour, its limit "
                            "(messages_per_hour = 2); the next may go in 60 min")  # fmt: skip
    assert said["muted"] == (True, "the owner turned messages to device muted off "
                             '([devices."aa:bb:cc:00:00:02"] messages = false)')  # fmt: skip
    assert said["quiet"] == (True, "device lamp is in its quiet hours (22:00-07:00, the "
                             "gateway's local time); try again after them")  # fmt: skip
    assert said["long"][0] and "at most 200 fit" in said["long"][1]
    assert said["control"][0] and "control character (U+0007)" in said["control"][1]
    assert said["gone"][0] and said["gone"][1].startswith("device lamp is not listening now")
    assert lamp.others == [] and muted.others == []  # nothing refused reached a device
    records = notify_records(run)
    assert [r["outcome"] for r in records] == [
        "ok", "ok", "rejected", "rejected", "rejected", "rejected", "rejected", "ok",
        "DeviceUnavailable"]  # fmt: skip
    assert {r["caller"] for r in records} == {"http:127.0.0.1 notify-test-host"}
    assert json.dumps(records[1]["arguments"]) == '{"message": "Second"}'
