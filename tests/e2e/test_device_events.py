"""Devices speak up: a device's ``notifications/message`` reaches hosts (docs/events.md).

Real gateways (uvicorn on port 0), a raw WebSocket device and an MQTT device on mosquitto or
the embedded broker, and the MCP SDK's ``Client`` in both eras over streamable HTTP.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp.types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPDeprecationWarning

from gateway.app import Running
from gateway.devices.events import events_uri, state_uri
from gateway.host_side import event_resources
from tests.conftest import DEVICE_TOKEN, bound, gateway
from tests.e2e.helpers import Inbox, RawDevice, aliases, serving
from tests.e2e.test_device_trust import EMBEDDED, check_in, listed_but_pending
from tests.e2e.test_mqtt import FIRMWARE, stock_device, wait_listed
from tests.fakes import tool
from tests.mqtt_helpers import Mosquitto, MqttDevice

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

JsonObject = dict[str, Any]


def logging_message(logger: str, data: object, level: str = "info") -> JsonObject:
    """What a device sends to report an event: MCP's logging notification in the envelope."""
    params = {"level": level, "logger": logger, "data": data}
    payload = {"jsonrpc": "2.0", "method": "notifications/message", "params": params}
    return {"session_id": "", "type": "mcp", "payload": payload}


class EventDevice(RawDevice):
    """A raw WebSocket device that also reports events."""

    async def report(self, logger: str, data: object) -> None:
        """Send one event."""
        assert self._ws is not None
        await self._ws.send(json.dumps(logging_message(logger, data)))


def porch() -> EventDevice:
    return EventDevice("02:00:00:00:00:31", "porch", [tool("self.porch.ping")])


async def read_json(client: Client, uri: str) -> Any:
    read = await client.read_resource(uri)
    return json.loads(read.contents[0].text)  # type: ignore[union-attr]


async def watching(run: Running, count: int) -> None:
    """Wait until ``count`` watchers beyond the gateway's own two follow its events."""
    with anyio.fail_after(bound(5)):
        await run.gateway.events.wait_watching(count + 2)


async def hosts_hear(run: Running, alias: str, report: Any) -> None:
    """A 2025-era host subscribed with resources/subscribe and a 2026-era one listening on the
    events URI both hear of the device's event, then read it; the state holds the latest."""
    inbox = Inbox(types.ResourceUpdatedNotification)
    async with (
        Client(run.mcp_url, mode="legacy", message_handler=inbox) as legacy,
        Client(run.mcp_url, mode="2026-07-28") as modern,
    ):
        assert legacy.server_capabilities.resources.subscribe is True  # type: ignore[union-attr]
        with pytest.warns(MCPDeprecationWarning):  # the 2025 era's way, deprecated since 2026
            await legacy.subscribe_resource(events_uri(alias))
        async with modern.listen(resource_subscriptions=[events_uri(alias)]) as stream:
            await report("door", {"open": True})
            await inbox.next_change()
            with anyio.fail_after(bound(5)):
                async for change in stream:
                    assert change.uri == events_uri(alias)  # type: ignore[union-attr]
                    break
        for client in (legacy, modern):
            [event] = await read_json(client, events_uri(alias))
            assert (event["device"], event["logger"], event["data"]) == (
                alias,
                "door",
                {"open": True},
            )
        await report("door", {"open": False})
        await inbox.next_change()
        await report("temp", 21.5)
        await inbox.next_change()
        state = await read_json(modern, state_uri(alias))
        assert {name: e["data"] for name, e in state.items()} == {
            "door": {"open": False},
            "temp": 21.5,
        }
        newest = await read_json(legacy, events_uri(alias))
        assert [e["data"] for e in newest] == [21.5, {"open": False}, {"open": True}]


async def test_a_websocket_and_an_mqtt_device_s_events_reach_subscribed_hosts_in_both_eras(
    tmp_path: Path,
) -> None:
    """Over WebSocket and over MQTT (mosquitto): subscribers of both eras hear, read, and the
    state resource holds each logger's latest value."""
    ws_device = porch()
    async with Mosquitto(tmp_path / "mosquitto") as broker:
        external = {"mqtt_mode": "external", "mqtt_host": "127.0.0.1", "mqtt_port": broker.port}
        async with gateway(tmp_path / "gw", devices=aliases(ws_device), **external) as run:
            mqtt = MqttDevice("127.0.0.1", broker.port, FIRMWARE, DEVICE_TOKEN, stock=False)
            async with mqtt, serving(run, ws_device):
                await wait_listed(run, FIRMWARE)
                mqtt_alias = run.gateway.registry.get(FIRMWARE).alias  # type: ignore[union-attr]

                async def mqtt_report(logger: str, data: object) -> None:
                    await mqtt.send(
                        {**logging_message(logger, data), "session_id": mqtt.session_id}
                    )

                await hosts_hear(run, ws_device.alias, ws_device.report)
                await hosts_hear(run, mqtt_alias, mqtt_report)


async def test_wait_for_event_started_before_the_event_returns_it(tmp_path: Path) -> None:
    """The meta-tool waits for the next event of the device and logger asked for; none: it
    says so; a timeout over the maximum is clamped and the result says so."""
    device = porch()
    async with (
        gateway(tmp_path, devices=aliases(device)) as run,
        serving(run, device),
        Client(run.mcp_url) as client,
        anyio.create_task_group() as tasks,
    ):
        assert "wait_for_event" in [t.name for t in (await client.list_tools()).tools]
        results: list[types.CallToolResult] = []
        returned = anyio.Event()

        async def wait() -> None:
            args = {"device": "porch", "logger": "button", "timeout": 10}
            results.append(await client.call_tool("wait_for_event", args))
            returned.set()

        tasks.start_soon(wait)
        await watching(run, 1)
        await device.report("door", "ignored: another logger")
        await device.report("button", {"pressed": 1})
        with anyio.fail_after(bound(5)):
            await returned.wait()
        [result] = results
        assert not result.is_error
        event = json.loads(result.content[0].text)  # type: ignore[union-attr]
        assert (event["device"], event["logger"], event["data"]) == (
            "porch",
            "button",
            {"pressed": 1},
        )
        none = await client.call_tool("wait_for_event", {"logger": "bell", "timeout": 0})
        assert none.content[0].text == "no event with logger 'bell' within 0 s"  # type: ignore[union-attr]
        unknown = await client.call_tool("wait_for_event", {"device": "attic"})
        assert unknown.is_error


async def test_wait_for_event_clamps_its_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A timeout over the maximum waits the maximum, and the result says so (the maximum is
    made small here so that the test does not wait a minute)."""
    monkeypatch.setattr(event_resources, "MAX_WAIT", 0.05)
    async with gateway(tmp_path) as run, Client(run.mcp_url) as client:
        result = await client.call_tool("wait_for_event", {"timeout": 600})
    assert result.content[0].text == (  # type: ignore[union-attr]
        "no event within 0.05 s (the timeout asked for was 600 s; at most 0.05)"
    )


async def test_a_flood_of_events_harms_no_other_device_and_memory_stays_bounded(
    tmp_path: Path,
) -> None:
    """10,000 events from one device: another device's calls all succeed meanwhile; the store
    holds at most `keep` of them, folds the rest, and its state ends on the last."""
    flooder, quiet = porch(), EventDevice("02:00:00:00:00:32", "garage", [tool("self.garage.ping")])
    async with (
        gateway(tmp_path, devices=aliases(flooder, quiet), events_keep=50) as run,
        serving(run, flooder, quiet),
        Client(run.mcp_url) as client,
        anyio.create_task_group() as tasks,
    ):
        store = run.gateway.events

        async def flood() -> None:
            for n in range(10_000):
                await flooder.report(f"sensor{n % 40}", {"n": n})

        tasks.start_soon(flood)
        for _ in range(20):
            result = await client.call_tool("garage_garage_ping", {})
            assert not result.is_error and result.content[0].text == "self.garage.ping done"  # type: ignore[union-attr]
        # The flooder answers a call only once the gateway read every frame it sent before.
        with anyio.fail_after(bound(30)):
            while len(quiet.calls) < 20 or flooder.calls == []:
                await client.call_tool("porch_porch_ping", {})
        assert len(store.recent(flooder.device_id)) <= 50
        assert store.coalesced > 9_000  # folded by the rate, not kept
        assert store.retained() <= 50 + 32 + 1  # recent, state (32 loggers at most), waiting
        assert max(e.data["n"] for e in store.state(flooder.device_id).values()) == 9_999  # type: ignore[index]
        assert len(quiet.calls) >= 20


async def test_events_of_a_pending_device_are_dropped_and_counted(tmp_path: Path) -> None:
    """A stock device waiting for approval reports an event: nobody hears it, /metrics counts it."""
    async with gateway(tmp_path, **EMBEDDED) as run:
        reply = (await check_in(run)).json()
        async with stock_device(reply) as device:
            await listed_but_pending(run)
            store = run.gateway.events
            session = {"session_id": device.session_id}
            await device.send({**logging_message("door", 1), **session})
            # Read in order: once the ping after it is answered, the event was dealt with.
            ping = {"jsonrpc": "2.0", "id": 99, "method": "ping"}
            await device.send({"type": "mcp", "payload": ping, **session})
            await device.wait_raw(lambda raw: b'"id":99' in raw)
            assert store.dropped == 1
            assert store.recent(device.device_id) == [] and store.retained() == 0
            async with httpx2.AsyncClient() as http:
                metrics = (await http.get(f"http://127.0.0.1:{run.host_port}/metrics")).text
            assert 'gateway_device_events_not_kept_total{reason="not_approved"} 1.0' in metrics


async def test_the_dashboard_shows_a_device_s_events_live(tmp_path: Path) -> None:
    """An open device's panel shows its recent events, and a new one without a reload."""
    from tests.e2e.test_dashboard import dashboard, row  # Playwright: only this test needs it

    device = porch()
    async with (
        gateway(tmp_path, devices=aliases(device)) as run,
        serving(run, device),
    ):
        await device.report("door", {"open": True})
        async with dashboard(run) as page:
            await page.click(f"{row(device.device_id)} .alias button")
            await page.wait_for_selector('#device-events li[data-logger="door"]')
            with anyio.fail_after(bound(10)):  # the page's feed of events is open
                await run.gateway.events.wait_watching(3)
            await device.report("button", {"pressed": 1})
            item = await page.wait_for_selector('#device-events li[data-logger="button"]')
            assert item is not None and '{"pressed":1}' in await item.inner_text()
            assert await page.locator("#device-events li").count() == 2


async def test_events_and_state_are_kept_across_a_restart(tmp_path: Path) -> None:
    """What a device reported is still its events and state after the gateway restarts; the
    files are private to the gateway's user."""
    device = porch()
    async with gateway(tmp_path, devices=aliases(device)) as run, serving(run, device):
        async with run.gateway.events.watch() as feed:
            await device.report("door", {"open": True})
            with anyio.fail_after(bound(5)):
                await anext(feed)
    [kept] = list((tmp_path / "events").glob("*.json"))
    assert kept.stat().st_mode & 0o077 == 0
    async with gateway(tmp_path, devices=aliases(device)) as run, Client(run.mcp_url) as client:
        [event] = await read_json(client, events_uri("porch"))
        state = await read_json(client, state_uri("porch"))
    assert event["data"] == {"open": True} and state["door"]["data"] == {"open": True}
