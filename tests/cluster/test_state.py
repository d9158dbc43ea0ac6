"""Fleet state that survives what clusters suffer, on a real mosquitto 2: identity bindings
decided on any replica, and a broker that lost its retained records repaired by the replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from contextlib import AsyncExitStack
from pathlib import Path

import aiomqtt
import anyio
import httpx2
import pytest

from gateway.app import Running
from gateway.cluster.replica import owner_of
from gateway.devices.registry import PENDING, DeviceRegistry
from tests.cluster.conftest import (
    PREFIX,
    Check,
    DeafFirstProxy,
    FilteringProxy,
    NoRetainedProxy,
    Proxy,
    StoresLateFirstProxy,
    cluster_options,
    eventually,
    replicas,
    shared_secret,
)
from tests.cluster.test_faults import online
from tests.cluster.test_liveness import joined
from tests.cluster.test_replicas import MQTT_DEVICE, STOCK, WS_DEVICE, lists
from tests.conftest import DEVICE_TOKEN, bound, gateway
from tests.device_side.test_ota import STOCK_BODY, STOCK_HEADERS
from tests.e2e.helpers import listed_device
from tests.mqtt_helpers import Mosquitto, MqttDevice

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

CLIENT_ID = STOCK_HEADERS["Client-Id"]


def state_is(state: str) -> Check:
    def check(registry: DeviceRegistry) -> bool:
        device = registry.get(STOCK)
        return device is not None and device.record.state == state

    return check


async def check_in(run: Running, client_id: str = CLIENT_ID) -> httpx2.Response:
    """A stock device's OTA check-in on ``run``, with ``client_id``."""
    url = f"http://127.0.0.1:{run.device_port}/xiaozhi/ota/"
    async with httpx2.AsyncClient() as http:
        return await http.post(url, headers={**STOCK_HEADERS, "Client-Id": client_id},
                               json=STOCK_BODY)  # fmt: skip


async def retained(port: int, topic: str) -> bytes:
    """The retained record on ``topic`` (the broker sends it on subscribing)."""
    async with aiomqtt.Client("127.0.0.1", port) as client:
        await client.subscribe(topic, qos=1)
        with anyio.fail_after(bound(5)):
            async for message in client.messages:
                assert isinstance(message.payload, bytes)
                return message.payload
    raise AssertionError("no retained record")


async def test_approval_on_another_replica_binds_the_device_on_every_replica(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A stock device checks in on replica 1 and waits; the user approves it on replica 2. Its
    own check-ins then succeed on every replica (the same credential everywhere), none is
    logged as an impersonation, and another Client-Id is refused everywhere. The broker's
    records never carry the Client-Id itself."""
    caplog.set_level(logging.WARNING)
    async with Mosquitto(tmp_path / "broker") as broker, replicas(tmp_path, broker.port) as runs:
        first, second, _ = runs
        assert (await check_in(first)).status_code == 200
        await eventually(runs, state_is(PENDING))
        device = second.gateway.registry.get(STOCK)
        assert device is not None
        second.gateway.registry.admin.approve(device)
        await eventually(runs, state_is("approved"))
        for payload in (await retained(broker.port, f"{PREFIX}/device/{STOCK}"),):
            assert CLIENT_ID.encode() not in payload and b'"binding": "sealed:' in payload
        replies = [await check_in(run) for run in runs + runs]  # twice: bound in clear, then
        assert [r.status_code for r in replies] == [200] * 6, [r.text for r in replies]
        assert len({r.json()["websocket"]["token"] for r in replies}) == 1  # one credential
        for run in runs:
            known = run.gateway.registry.get(STOCK)
            assert known is not None and known.conflict is None
        assert "bound to another identity" not in caplog.text
        for run in runs:
            refused = await check_in(run, "5b3f4c1e-0000-4000-8000-00000000beef")
            assert refused.status_code == 403 and "another identity" in refused.text


async def test_a_broker_that_lost_its_state_is_repaired_and_a_cold_replica_takes_nothing_away(
    tmp_path: Path,
) -> None:
    """mosquitto without persistence restarts: every retained record is gone. The replicas
    rejoin and publish again what they know; a cold replica joining afterwards knows the whole
    fleet, and the devices stay online and listed on every replica, the cold one too."""
    async with Mosquitto(tmp_path / "broker") as broker, replicas(tmp_path, broker.port) as runs:
        first, second, third = runs
        mqtt = MqttDevice("127.0.0.1", broker.port, MQTT_DEVICE, DEVICE_TOKEN, stock=False)
        async with mqtt, listed_device(first, WS_DEVICE):
            await eventually(runs, lists(WS_DEVICE))
            await eventually(runs, lists(MQTT_DEVICE))
            await broker.stop()
            await eventually([second, third], lambda r: not r.get(WS_DEVICE).online)  # type: ignore[union-attr]
            await broker.start()  # the same port, no retained record at all
            await eventually(runs, lists(WS_DEVICE))
            await eventually(runs, lists(MQTT_DEVICE))
            record = await retained(broker.port, f"{PREFIX}/device/{WS_DEVICE}")
            assert b'"state": "approved"' in record  # published again by the replicas
            options = cluster_options(broker.port, "gw-cold")
            async with gateway(shared_secret(tmp_path / "cold"), **options) as cold:
                assert {d.device_id for d in cold.gateway.registry.devices()} >= {
                    WS_DEVICE,
                    MQTT_DEVICE,
                }  # known before it serves anything
                await eventually([cold, *runs], lists(WS_DEVICE))
                await eventually([cold, *runs], lists(MQTT_DEVICE))
                names = {t.name for t in first.gateway.registry.exposed_tools()}
                assert {t.name for t in cold.gateway.registry.exposed_tools()} == names


async def test_a_broker_that_keeps_retained_messages_from_wildcards_is_refused(
    tmp_path: Path,
) -> None:
    """Behind a broker that sends no retained message to a wildcard subscription, a replica
    would pass its barrier knowing no device: it does not join, and says why in one line that
    names the broker, however often it tries again."""
    said = Said()
    logging.getLogger("gateway.cluster").addHandler(said)
    async with Mosquitto(tmp_path / "broker") as broker, NoRetainedProxy(broker.port) as fake:
        options = cluster_options(fake.port, "gw-1")

        async def start() -> None:
            async with gateway(shared_secret(tmp_path / "gw-1"), **options):
                raise AssertionError("the replica joined")

        starting = asyncio.create_task(start())
        try:
            with anyio.fail_after(bound(20)):
                await said.error.wait()
                while fake.connections < 3:  # tried again, twice: said once
                    await fake.connected.wait()
                    fake.connected.clear()
            [line] = said.lines
            assert f"cluster broker at 127.0.0.1:{fake.port} does not send retained" in line
            assert "will not serve" in line and not starting.done()
        finally:
            logging.getLogger("gateway.cluster").removeHandler(said)
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting


@pytest.mark.parametrize("node", [DeafFirstProxy, StoresLateFirstProxy])
async def test_a_broker_node_electing_is_tried_again_not_refused(
    tmp_path: Path, node: type[FilteringProxy]
) -> None:
    """A broker node that, on the replica's first connection, acknowledges everything but
    delivers no message (a NATS node while JetStream elects leaders after another node died),
    or delivers live messages but not the retained probe (it stores it late: "unable to store
    retained message ... timeout"), is no verdict on the broker: no "does not send retained
    messages" line, no ERROR; the replica tries again and joins."""
    said = Said()
    logging.getLogger("gateway.cluster").addHandler(said)
    async with Mosquitto(tmp_path / "broker") as broker, node(broker.port) as electing:
        # The replica's own client alone on it (no MQTT devices): its first connection is
        # the one the node serves so.
        options = cluster_options(electing.port, "gw-1", mqtt_mode="off")
        try:
            with anyio.fail_after(bound(30)):  # the start returns once the replica joined
                async with gateway(shared_secret(tmp_path / "gw-1"), **options) as run:
                    cluster = run.gateway.cluster
                    assert cluster is not None and cluster.health() is None
                    assert electing.connections >= 2 and said.lines == []
        finally:
            logging.getLogger("gateway.cluster").removeHandler(said)


class Said(logging.Handler):
    """The error lines logged, and an event at each."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []
        self.error = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        self.error.set()


async def test_a_cold_replica_that_joined_a_wiped_broker_first_finds_its_devices_once_repaired(
    tmp_path: Path,
) -> None:
    """The broker loses its state and a cold replica joins it before the replicas that know the
    fleet are back. The rule gives it a stock MQTT device it has never heard of; once the others
    rejoin and repair the broker, it learns the device and looks for it at once: the device is
    listed everywhere within seconds, not at the next probe round (60 s)."""
    names = ["gw-1", "gw-2", "gw-cold"]
    mac = next(
        m for i in range(256) if owner_of(m := f"aa:bb:cc:dd:ee:{i:02x}", names) == "gw-cold"
    )
    async with Mosquitto(tmp_path / "broker") as broker, AsyncExitStack() as stack:
        proxies = [await stack.enter_async_context(Proxy(broker.port)) for _ in names[:2]]
        runs = [
            await stack.enter_async_context(
                gateway(shared_secret(tmp_path / n), **cluster_options(proxy.port, n))
            )
            for n, proxy in zip(names, proxies, strict=False)
        ]
        await joined(runs)  # its hello reaches the owner's transport
        device = MqttDevice("127.0.0.1", broker.port, mac, DEVICE_TOKEN, stock=True, subscribe=True)
        await stack.enter_async_context(device)
        await device.wait_connected()
        await device.hello()
        await eventually(runs, online(mac))
        for proxy in proxies:
            proxy.cut()
        await broker.stop()
        await broker.start()  # no retained record at all
        options = cluster_options(broker.port, "gw-cold")
        cold = await stack.enter_async_context(gateway(shared_secret(tmp_path / "cold"), **options))
        assert cold.gateway.registry.get(mac) is None  # it joined an empty broker
        for proxy in proxies:
            proxy.heal()
        with anyio.fail_after(bound(10)):
            await eventually([cold, *runs], online(mac))
