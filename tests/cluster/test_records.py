"""Bad input through the broker: each bad record refused alone, with a log line; device logins
kept out of the cluster's topics by the broker's ACL (mosquitto 2, docs/cluster.md)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import aiomqtt
import pytest

from gateway.cluster import client as cluster_client
from gateway.cluster.client import ClusterClient, broker_login
from gateway.cluster.records import BadRecord, ClusterTopics, FleetRecord, Presence, ReplicaRecord
from gateway.devices.catalogue import digest_of
from gateway.devices.registry import DeviceRegistry
from tests.cluster.conftest import PREFIX, Check, eventually, replicas
from tests.conftest import bound
from tests.fakes import tool
from tests.mqtt_helpers import Mosquitto

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

GOOD = "aa:bb:cc:dd:ee:10"
TOOLS: list[object] = [tool("self.lamp.on"), {"name": "self.bad", "inputSchema": {"type": 7}}]

# The ACL docs/cluster.md gives: replicas write the cluster's topics and the devices' down
# topics; a device writes only its own up and status topics and reads its own down topic.
ACL = f"""user replica
topic readwrite {PREFIX}/#
topic readwrite xiaozhi/#

pattern write xiaozhi/%u/up
pattern write xiaozhi/%u/status
pattern read xiaozhi/%u/down
"""


def record(**fields: object) -> bytes:
    base = {"alias": "porch", "state": "approved", "at": 1.0, "by": "intruder"}
    return json.dumps({**base, **fields}).encode()


def knows(device_id: str, tools: int) -> Check:
    def check(registry: DeviceRegistry) -> bool:
        device = registry.get(device_id)
        return device is not None and device.catalogue is not None and len(device.tools) == tools

    return check


async def test_bad_records_are_refused_one_by_one_and_the_rest_is_taken(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Malformed records, a catalogue that does not hash to its name: each refused with a log
    line; a catalogue with one bad tool serves the good one; the replica carries on."""
    caplog.set_level(logging.WARNING)
    topics = ClusterTopics(PREFIX)
    digest = digest_of(TOOLS)
    async with Mosquitto(tmp_path / "broker") as broker, replicas(tmp_path, broker.port, 1) as runs:
        async with aiomqtt.Client("127.0.0.1", broker.port) as raw:
            await raw.publish(topics.device("aa:bb:cc:dd:ee:11"), b"{not json", retain=True)
            await raw.publish(topics.device("aa:bb:cc:dd:ee:12"), record(state="owner"))
            await raw.publish(topics.device("NOT A DEVICE"), record())
            await raw.publish(topics.catalogue("0" * 64), json.dumps(TOOLS).encode())
            await raw.publish(topics.presence(GOOD), b'{"replica": 5}')
            await raw.publish(topics.replica("ghost"), b'{"no": 400, "at": 1}')
            await raw.publish(topics.catalogue(digest), json.dumps(TOOLS).encode(), retain=True)
            await raw.publish(topics.device(GOOD), record(catalogue=digest), retain=True)
            await eventually(runs, knows(GOOD, 1))
            cluster = runs[0].gateway.cluster
            assert cluster is not None and await cluster.client.resubscribe()  # all again: same
            await cluster.client.sync()
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert any("aa:bb:cc:dd:ee:11 refused: not JSON" in m for m in refused)
    assert any("aa:bb:cc:dd:ee:12 refused: state is not one of" in m for m in refused)
    assert any("NOT A DEVICE refused: the topic does not name a device id" in m for m in refused)
    assert any("do not hash to the digest" in m for m in refused)
    assert any("presence record" in m and "replica is not a short string" in m for m in refused)
    assert any("replica record ghost refused" in m for m in refused)
    assert any("tool 'self.bad' rejected" in r.getMessage() for r in caplog.records)
    device = runs[0].gateway.registry.get(GOOD)
    assert device is not None and device.alias == "porch" and list(device.tools) == ["self.lamp.on"]


def test_records_read_strictly() -> None:
    """Each kind reads only what it should; encode and read agree."""
    presence = Presence("gw-1", "s1", 2.0)
    assert Presence.read(presence.encode()) == presence
    assert ReplicaRecord.read(ReplicaRecord(3, 1.5).encode()) == ReplicaRecord(3, 1.5)
    tomb = FleetRecord(GOOD, 3.0, "gw-1", forgotten=True)
    assert FleetRecord.read(GOOD, tomb.encode()) == tomb
    for bad in (b"[]", b'{"no": true, "at": 1}', b'{"no": 1, "at": "now"}'):
        with pytest.raises(BadRecord):
            ReplicaRecord.read(bad)
    with pytest.raises(BadRecord):
        FleetRecord.read(GOOD, record(server_info=[1]))
    assert ClusterTopics(PREFIX).parse("fleet/bridge/x/sideways") is None
    assert ClusterTopics(PREFIX).parse("other/device/x") is None


async def test_device_logins_cannot_write_the_cluster_topics(tmp_path: Path) -> None:
    """On mosquitto 2 with the documented ACL, a device's forged fleet record never reaches a
    replica, while a replica's own record does."""
    users = {"replica": "replica-secret", "aabbccddee20": "device-secret"}
    topics = ClusterTopics(PREFIX)
    broker = Mosquitto(tmp_path / "broker", users, acl=ACL, username_as_clientid=False)
    async with broker:
        login = {"cluster_username": "replica", "cluster_password": "replica-secret"}
        async with replicas(tmp_path, broker.port, 1, **login) as runs:
            registry = runs[0].gateway.registry
            async with aiomqtt.Client("127.0.0.1", broker.port, username="aabbccddee20",
                                      password="device-secret") as device:  # fmt: skip
                await device.publish(topics.device("aabbccddee20"), record(), qos=1)
                await device.publish(topics.presence("aabbccddee20"), b'{"replica":"gw-1"}')
            async with aiomqtt.Client("127.0.0.1", broker.port, username="replica",
                                      password="replica-secret") as replica:  # fmt: skip
                await replica.publish(topics.device("aabbccddee21"), record(), qos=1)
            await eventually(runs, lambda r: r.get("aabbccddee21") is not None)
            assert registry.get("aabbccddee20") is None  # the broker dropped the forgery


async def test_a_replica_joins_over_mqtts_with_the_brokers_ca(tmp_path: Path) -> None:
    """mqtts:// with [cluster] ca_file: the replica joins over TLS, with a password login."""
    users = {"replica": "replica-secret"}
    async with Mosquitto(tmp_path / "broker", users, tls=True) as broker:
        options = {"cluster_username": "replica", "cluster_password": "replica-secret",
                   "cluster_ca_file": broker.cert, "mqtt_mode": "off"}  # fmt: skip
        async with replicas(tmp_path, broker.port, 1, **options) as runs:
            cluster = runs[0].gateway.cluster
            assert cluster is not None and cluster.health() is None
            assert cluster.login.tls and cluster.login.port == broker.port


async def test_a_lost_sync_token_is_asked_for_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The echo the join waits on never comes back once: the replica asks again and joins,
    instead of waiting forever to serve."""
    monkeypatch.setattr(cluster_client, "_SYNC_AGAIN", 0.2)
    ready = asyncio.Event()

    async def on_ready() -> None:
        ready.set()

    async with Mosquitto(tmp_path / "broker") as broker:
        login = broker_login(f"mqtt://127.0.0.1:{broker.port}", None, None, None)
        joining = ClusterClient([login], ClusterTopics(PREFIX), "gw-x", lambda t, d: None,
                                on_ready, lambda: None)  # fmt: skip
        publish, lost = joining.publish, []

        async def lose_the_first_sync(topic: str, payload: bytes, **kwargs: Any) -> bool:
            if topic == joining.topics.sync("gw-x") and not lost:
                lost.append(payload)  # as a broker whose queue overflowed would
                return True
            return await publish(topic, payload, **kwargs)

        monkeypatch.setattr(joining, "publish", lose_the_first_sync)
        task = asyncio.create_task(joining.run())
        try:
            async with asyncio.timeout(bound(10)):
                await joining.connected.wait()
            assert lost and ready.is_set()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_a_join_that_fails_is_logged_and_tried_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What the replica does once joined fails (a bug): it says so, with the traceback, and
    joins again, instead of its start waiting forever in silence."""
    tries: list[int] = []

    async def on_ready() -> None:
        tries.append(1)
        if len(tries) == 1:
            raise RuntimeError("a bug in joining")

    async with Mosquitto(tmp_path / "broker") as broker:
        login = broker_login(f"mqtt://127.0.0.1:{broker.port}", None, None, None)
        joining = ClusterClient([login], ClusterTopics(PREFIX), "gw-x", lambda t, d: None,
                                on_ready, lambda: None)  # fmt: skip
        task = asyncio.create_task(joining.run())
        try:
            async with asyncio.timeout(bound(15)):
                await joining.connected.wait()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert len(tries) == 2
    [failed] = [r for r in caplog.records if "joining the cluster" in r.getMessage()]
    assert failed.exc_info is not None and "a bug in joining" in str(failed.exc_info[1])
