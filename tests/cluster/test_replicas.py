"""Three replicas on one mosquitto 2: one fleet, the same names everywhere, every call path.

Real replicas (uvicorn each, port 0), a real broker, real devices: a WebSocket device on one
replica, an MQTT device on the broker; MCP hosts are the SDK's client over streamable HTTP.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client

from gateway.app import Running
from gateway.cluster.remote import RemoteSession
from gateway.devices.registry import PENDING, DeviceRegistry
from tests.cluster.conftest import Check, cluster_options, eventually, replicas, shared_secret
from tests.conftest import DEVICE_TOKEN, bound, gateway
from tests.device_side.test_ota import STOCK_BODY, STOCK_HEADERS
from tests.e2e.helpers import Inbox, listed_device
from tests.mqtt_helpers import Mosquitto, MqttDevice

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

WS_DEVICE = "02:00:00:00:00:01"
WS_ON_THIRD = "02:00:00:00:00:03"
MQTT_DEVICE = "aa:bb:cc:dd:ee:02"
STOCK = str(STOCK_BODY["mac_address"])


def lists(device_id: str) -> Check:
    """A check: the device is online with its tools shown to hosts."""

    def check(registry: DeviceRegistry) -> bool:
        device = registry.get(device_id)
        return device is not None and device.online and device.exposed

    return check


def names(run: Running) -> set[str]:
    return {tool.name for tool in run.gateway.registry.exposed_tools()}


def mcp_name(run: Running, device_id: str, tool: str) -> str:
    [name] = [t.name for t in run.gateway.registry.exposed_tools()
              if t.device.device_id == device_id and t.spec.name == tool]  # fmt: skip
    return name


async def call(run: Running, name: str, arguments: dict[str, object]) -> str:
    async with Client(run.mcp_url, mode="legacy") as client:
        result = await client.call_tool(name, arguments)
    assert not result.is_error, result
    text = result.content[0].text  # type: ignore[union-attr]
    assert isinstance(text, str)
    return text


async def test_three_replicas_one_fleet_every_call_path(tmp_path: Path) -> None:
    """WebSocket devices on replicas 1 and 3 and an MQTT device on the broker: every replica
    lists them under the same names and calls them (local, across replicas, over MQTT)."""
    async with Mosquitto(tmp_path / "broker") as broker, replicas(tmp_path, broker.port) as runs:
        first, second, third = runs
        assert len({run.gateway.cluster.no for run in runs if run.gateway.cluster}) == 3
        mqtt = MqttDevice("127.0.0.1", broker.port, MQTT_DEVICE, DEVICE_TOKEN, stock=False)
        async with mqtt, listed_device(first, WS_DEVICE), listed_device(third, WS_ON_THIRD):
            await eventually(runs, lists(WS_DEVICE))
            await eventually(runs, lists(WS_ON_THIRD))
            await eventually(runs, lists(MQTT_DEVICE))
            assert names(first) == names(second) == names(third)
            session = second.gateway.registry.get(WS_DEVICE).session  # type: ignore[union-attr]
            assert isinstance(session, RemoteSession) and session.replica == "gw-1"
            lamp = mcp_name(first, WS_DEVICE, "self.lamp.turn_on")
            assert await call(first, lamp, {}) == "true"  # local
            state = mcp_name(second, WS_DEVICE, "self.lamp.get_state")
            assert json.loads(await call(second, state, {}))["power"] is True  # across
            assert json.loads(await call(third, state, {}))["power"] is True
            over_mqtt = mcp_name(third, MQTT_DEVICE, "self.lamp.turn_on")
            assert await call(third, over_mqtt, {}) == "true"  # to an MQTT device
            far = mcp_name(first, WS_ON_THIRD, "self.lamp.turn_on")
            assert await call(first, far, {}) == "true"  # across, the other way
            assert mqtt.calls == ["self.lamp.turn_on"]  # once: no other replica answered
            await audit_and_metrics_say_which_replica(second)
            cold = gateway(shared_secret(tmp_path / "cold"),
                           **cluster_options(broker.port, "gw-cold"))  # fmt: skip
            async with cold as late:  # an empty data dir: the broker tells it the whole fleet
                assert late.gateway.registry.devices()  # known before it serves anything
                await eventually([late], lists(WS_DEVICE))
                await eventually([late], lists(MQTT_DEVICE))
                assert names(late) == names(first)
        await eventually(runs, lambda r: not r.get(WS_DEVICE).online)  # type: ignore[union-attr]


async def test_approval_rename_and_forget_on_one_replica_reach_the_others(
    tmp_path: Path,
) -> None:
    """A stock device checks in on replica 1 (pending); replica 2 sees it pending, replica 3
    approves it, renames it and forgets it, and every replica follows."""
    async with Mosquitto(tmp_path / "broker") as broker, replicas(tmp_path, broker.port) as runs:
        first, _, third = runs
        url = f"http://127.0.0.1:{first.device_port}/xiaozhi/ota/"
        async with httpx2.AsyncClient() as http:
            response = await http.post(url, headers=STOCK_HEADERS, json=STOCK_BODY)
        assert response.status_code == 200

        def state_is(state: str) -> Check:
            def check(registry: DeviceRegistry) -> bool:
                device = registry.get(STOCK)
                return device is not None and device.record.state == state

            return check

        await eventually(runs, state_is(PENDING))
        device = third.gateway.registry.get(STOCK)
        assert device is not None
        third.gateway.registry.admin.approve(device)
        await eventually(runs, state_is("approved"))
        third.gateway.registry.admin.rename(device, "porch")
        await eventually(runs, lambda r: r.find("porch") is not None)
        third.gateway.registry.admin.forget(device)
        await eventually(runs, lambda r: r.get(STOCK) is None)


async def audit_and_metrics_say_which_replica(run: Running) -> None:
    """The audit log stays per replica, each record tagged; every /metrics series labelled."""
    audit = run.gateway.audit.path
    assert audit is not None
    run.gateway.audit.flush()  # records of a moment are written together, a little later
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert records and all(r["replica"] == "gw-2" for r in records)
    async with httpx2.AsyncClient() as http:
        metrics = await http.get(f"http://127.0.0.1:{run.host_port}/metrics")
    samples = [line for line in metrics.text.splitlines() if line and not line.startswith("#")]
    assert samples and all('replica="gw-2"' in line for line in samples)
    assert 'gateway_calls_total{replica="gw-2",outcome="ok"} 1.0' in samples


async def test_list_changed_reaches_hosts_on_every_replica(tmp_path: Path) -> None:
    """A host on replica 3 is told the tool list changed when a device joins replica 1 (then
    lists its tools and calls one), and again when it is renamed there."""
    async with Mosquitto(tmp_path / "broker") as broker, replicas(tmp_path, broker.port) as runs:
        first, _, third = runs
        inbox = Inbox()
        async with Client(third.mcp_url, mode="legacy", message_handler=inbox) as client:
            with anyio.fail_after(bound(5)):
                await third.gateway.frontend.notifier.wait_for_sessions(1)
            async with listed_device(first, WS_DEVICE):
                await inbox.next_change()
                await eventually([third], lists(WS_DEVICE))
                listed = {tool.name for tool in (await client.list_tools()).tools}
                lamp = mcp_name(third, WS_DEVICE, "self.lamp.turn_on")
                assert lamp in listed
                assert not (await client.call_tool(lamp, {})).is_error
                device = first.gateway.registry.get(WS_DEVICE)
                assert device is not None
                first.gateway.registry.admin.rename(device, "hall")  # it changes: new names
                await inbox.next_change()
                listed = {tool.name for tool in (await client.list_tools()).tools}
                assert "hall_lamp_turn_on" in listed and lamp not in listed
