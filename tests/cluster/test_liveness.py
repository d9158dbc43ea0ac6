"""MQTT devices are found again in seconds, not at the next probe round (60 s): after a broker
restart, and when a rebooted device checks in through OTA on whichever replica. Three replicas
on a real mosquitto, stock-like devices (no last will, silent until probed)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
import httpx2
import pytest

from gateway.app import Running
from gateway.cluster.replica import owner_of
from gateway.net.addresses import ListenAddress
from tests.cluster.conftest import cluster_options, eventually, replicas, shared_secret
from tests.cluster.test_faults import call_text, online, tool
from tests.cluster.test_owner import MQTT, NAMES, behind_proxies, name, owners, run_by
from tests.cluster.test_owner import stock as stock_device
from tests.conftest import DEVICE_TOKEN, bound, gateway
from tests.device_side.test_ota import STOCK_BODY, STOCK_HEADERS
from tests.mqtt_helpers import Mosquitto, MqttDevice

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

DEVICES = ["aa:bb:cc:dd:ee:31", "aa:bb:cc:dd:ee:32", "aa:bb:cc:dd:ee:33"]


def stock(port: int, device_id: str) -> MqttDevice:
    """Stock firmware: no last will, silent until probed or a conversation opens."""
    return MqttDevice("127.0.0.1", port, device_id, DEVICE_TOKEN, stock=True, subscribe=True)


def offering_mqtt(port: int) -> dict[str, object]:
    """Replicas whose OTA endpoint offers stock devices MQTT, on the cluster broker (as in
    deploy/cluster/: the embedded broker's listener is set, and stays off in a cluster)."""
    return {
        "mqtt_listen": ListenAddress("127.0.0.1", 0),
        "mqtt_public_endpoint": f"127.0.0.1:{port}",
    }


async def joined(runs: list[Running]) -> None:
    """Every replica is back on the broker: its cluster client and its MQTT transport."""
    with anyio.fail_after(bound(20)):
        for run in runs:
            assert run.gateway.cluster is not None and run.gateway.mqtt is not None
            await run.gateway.cluster.client.connected.wait()
            await run.gateway.mqtt.connected.wait()


async def test_every_mqtt_device_is_back_within_10_s_of_a_broker_restart(
    tmp_path: Path,
) -> None:
    """The broker restarts; the devices reach it after the replicas did (their first probe on
    reconnecting missed them). Probed again over the first seconds, each is listed on every
    replica within 10 s of reaching the broker."""
    async with Mosquitto(tmp_path / "broker") as broker, replicas(tmp_path, broker.port) as runs:
        assert {owner_of(d, NAMES) for d in DEVICES} != {NAMES[0]}  # not all on one replica
        for device_id in DEVICES:
            async with stock(broker.port, device_id) as device:
                await device.wait_connected()
                await device.hello()  # its first word: the fleet knows it from now on
                await eventually(runs, online(device_id))
        await broker.stop()
        for device_id in DEVICES:
            await eventually(runs, online(device_id, False))
        await broker.start()
        await joined(runs)
        devices = [stock(broker.port, device_id) for device_id in DEVICES]
        async with devices[0], devices[1], devices[2]:
            with anyio.fail_after(bound(10)):
                for device_id in DEVICES:
                    await eventually(runs, online(device_id))


async def test_a_rebooted_device_is_found_at_once_whichever_replica_took_its_check_in(
    tmp_path: Path,
) -> None:
    """A stock device, approved, boots: its OTA check-in reaches a replica that does not own it,
    then it joins the broker and says nothing. Its owner probes it at once: listed everywhere within
    10 s, not at the next probe round."""
    device_id = str(STOCK_BODY["mac_address"])
    async with Mosquitto(tmp_path / "broker") as broker, \
            replicas(tmp_path, broker.port, **offering_mqtt(broker.port)) as runs:  # fmt: skip
        owner = owner_of(device_id, NAMES)
        other = next(r for r, n in zip(runs, NAMES, strict=True) if n != owner)
        url = f"http://127.0.0.1:{other.device_port}/xiaozhi/ota/"
        async with httpx2.AsyncClient() as http:
            assert (await http.post(url, headers=STOCK_HEADERS, json=STOCK_BODY)).status_code == 200
            await eventually(runs, lambda r: r.get(device_id) is not None)
            device = runs[0].gateway.registry.get(device_id)
            assert device is not None
            runs[0].gateway.registry.admin.approve(device)
            await eventually(runs, lambda r: r.get(device_id).record.state == "approved")  # type: ignore[union-attr]
            # It reboots: a check-in on a replica that does not own it, then the broker.
            reply = await http.post(url, headers=STOCK_HEADERS, json=STOCK_BODY)
            assert reply.status_code == 200 and "mqtt" in reply.json()
        async with stock(broker.port, device_id) as rebooted:
            await rebooted.wait_connected()
            with anyio.fail_after(bound(10)):
                await eventually(runs, online(device_id))
            assert rebooted.hellos.empty() and not rebooted.calls  # found by probing alone


async def test_a_rejoining_replica_takes_its_devices_back_without_an_offline_blink(
    tmp_path: Path,
) -> None:
    """The owner of an MQTT device is cut, and the replica the rule picks next runs its session.
    Healed, the owner takes the device back: the replica that held it keeps the session until
    the owner announces it, so no replica that stayed ever shows the device offline."""
    async with Mosquitto(tmp_path / "broker") as broker, AsyncExitStack() as stack:
        proxies = await stack.enter_async_context(behind_proxies(tmp_path, broker.port))
        runs = [
            await stack.enter_async_context(
                gateway(shared_secret(tmp_path / n), **cluster_options(proxy.port, n))
            )
            for n, proxy in zip(NAMES, proxies, strict=True)
        ]
        device = await stack.enter_async_context(stock_device(broker.port))
        await device.wait_connected()
        await device.hello()
        owner = owner_of(MQTT, NAMES)
        await eventually(runs, run_by(MQTT, owner))
        proxies[NAMES.index(owner)].cut()
        survivors = [r for r in runs if name(r) != owner]
        heir = owner_of(MQTT, [name(r) for r in survivors])
        await eventually(survivors, run_by(MQTT, heir))
        # The heir's own discovery done (it lists the device's tools itself, once).
        await eventually([runs[NAMES.index(heir)]], lambda r: r.get(MQTT).connected_at is None)  # type: ignore[union-attr]
        blinks: list[str] = []
        for run in survivors:
            run.gateway.registry.subscribe_records(offline_watcher(run, blinks))
        shown = [run.gateway.registry.version for run in survivors]  # what hosts see
        proxies[NAMES.index(owner)].heal()
        await eventually(runs, run_by(MQTT, owner))
        assert owners(runs) == [owner]
        assert blinks == []  # never offline on a replica that stayed, not even for a moment
        for run in runs:
            assert (await call_text(run, tool(run, MQTT, "self.lamp.get_state"), {}))[0] is False
        assert [run.gateway.registry.version for run in survivors] == shown  # no list_changed


def offline_watcher(run: Running, blinks: list[str]) -> Callable[[str, object], None]:
    """Told of every record the registry saves: notes the replica if the device is offline."""
    registry = run.gateway.registry

    def saved(device_id: str, record: object) -> None:
        device = registry.get(device_id)
        if device_id == MQTT and (device is None or not device.online):
            blinks.append(name(run))

    return saved
