"""The fleet's records against a real registry, broker-free: what comes in, what goes out."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from gateway.cluster.bridge import Bridge
from gateway.cluster.fleet import Fleet
from gateway.cluster.records import ClusterTopics, FleetRecord, Presence, ReplicaRecord, key_name
from gateway.cluster.remote import RemoteCalls, RemoteSession
from gateway.cluster.replica import id_slice
from gateway.devices.catalogue import digest_of
from gateway.errors import DeviceUnavailable
from tests.conftest import bound, make_config
from tests.fakes import ScriptedSession, Stack

pytestmark = pytest.mark.anyio

DEVICE = "02:00:00:00:00:05"
TOPICS = ClusterTopics("fleet")
ENTRIES: list[object] = [{"name": "self.lamp.turn_on", "description": "on",
                          "inputSchema": {"type": "object", "properties": {}}}]  # fmt: skip
DIGEST = digest_of(ENTRIES)


async def _publish(topic: str, payload: bytes, retain: bool = False) -> bool:
    return False  # no broker here: what goes out is read from the fleet's outbox


def fleet_on(tmp_path: Path, *, numbered: bool = True) -> tuple[Stack, Fleet]:
    """A replica's fleet (``numbered``: it has claimed its number, as once it joined)."""
    stack = Stack(make_config(tmp_path, cluster_broker=("mqtt://127.0.0.1:1",)))
    remote = RemoteCalls(TOPICS, id_slice(1), _publish, 65536)
    bridge = Bridge(TOPICS, "gw-1", id_slice(1), _publish)
    fleet = Fleet(stack.registry, TOPICS, "gw-1", remote, bridge)
    if numbered:
        fleet.numbered()
    return stack, fleet


def sent(fleet: Fleet) -> list[tuple[str, bytes]]:
    out = []
    while not fleet.outbox.empty():
        topic, payload, _ = fleet.outbox.get_nowait()
        out.append((topic, payload))
    return out


def record(at: float, by: str = "gw-2") -> bytes:
    return FleetRecord(DEVICE, at, by, alias="porch", state="approved").encode()


async def test_last_writer_wins_and_a_change_made_while_cut_off_is_published_on_rejoining(
    tmp_path: Path,
) -> None:
    stack, fleet = fleet_on(tmp_path)
    fleet.on_record("device", DEVICE, record(10.0))
    device = stack.registry.get(DEVICE)
    assert device is not None and device.alias == "porch"
    fleet.on_record("device", DEVICE, FleetRecord(DEVICE, 5.0, "gw-3", alias="old").encode())
    assert device.alias == "porch"  # older: ignored
    sent(fleet)
    stack.registry.admin.rename(device, "hall")  # here, while the broker does not hear it
    [(topic, payload)] = sent(fleet)
    assert topic == TOPICS.device(DEVICE) and json.loads(payload)["alias"] == "hall"
    fleet.on_record("device", DEVICE, record(11.0))  # older than the rename: ignored
    assert device.alias == "hall"
    fleet.rejoined()  # the broker never echoed the rename: say it again
    assert [json.loads(p)["alias"] for t, p in sent(fleet) if t == TOPICS.device(DEVICE)] == [
        "hall"
    ]
    stack.close()


async def test_a_tombstone_forgets_the_device_and_closes_its_session_here(tmp_path: Path) -> None:
    stack, fleet = fleet_on(tmp_path)
    session = ScriptedSession()
    stack.registry.connect(DEVICE, session)
    fleet.on_record(
        "device", DEVICE, FleetRecord(DEVICE, time.time() + 1, "gw-2", forgotten=True).encode()
    )
    assert stack.registry.get(DEVICE) is None
    for task in list(fleet._closing):  # the session closes in a task of its own
        await task
    assert session.closed
    stack.registry.connect(DEVICE, ScriptedSession())
    again = stack.registry.get(DEVICE)
    assert again is not None
    stack.registry.admin.forget(again)
    assert json.loads(sent(fleet)[-1][1])["forgotten"] is True  # forgotten here: a tombstone
    stack.close()


def held_by_gw2(fleet: Fleet, presence: Presence | None = None) -> None:
    """The broker's records of an approved device with its tools, held by live replica gw-2
    (a WebSocket device, unless ``presence`` says otherwise)."""
    fleet.on_record("catalogue", DIGEST, json.dumps(ENTRIES).encode())
    listed = FleetRecord(DEVICE, 10.0, "gw-2", alias="porch", state="approved", catalogue=DIGEST)
    fleet.on_record("device", DEVICE, listed.encode())
    fleet.on_record("replica", "gw-2", ReplicaRecord(2, 1.0).encode())
    fleet.on_record("presence", DEVICE, (presence or Presence("gw-2", "s1", 1.0)).encode())


async def test_a_silent_replica_is_gone_and_a_past_life_presence_is_cleared(tmp_path: Path) -> None:
    stack, fleet = fleet_on(tmp_path)
    held_by_gw2(fleet)
    device = stack.registry.get(DEVICE)
    assert device is not None and isinstance(device.session, RemoteSession)
    fleet.replicas.heard_at["gw-2"] = time.monotonic() - 3600  # no heartbeat for an hour
    assert fleet.expire() == ["gw-2"]
    assert not device.online and "gw-2" not in fleet.live
    sent(fleet)
    fleet.on_record("presence", "02:00:00:00:00:06", Presence("gw-1", "s0", 1.0).encode())
    assert sent(fleet) == [(TOPICS.presence("02:00:00:00:00:06"), b"")]  # ours, from a past run
    stack.close()


async def test_a_remote_device_is_listed_only_once_its_tools_are_known_here(tmp_path: Path) -> None:
    """Its owner announces it before the catalogue record arrives (a storm of joins): hosts
    here see it online only with its tools, never online and empty."""
    stack, fleet = fleet_on(tmp_path)
    entries, digest = ENTRIES, DIGEST
    fleet.on_record("replica", "gw-2", ReplicaRecord(2, time.time()).encode())
    fleet.on_record("presence", DEVICE, Presence("gw-2", "s1", time.time()).encode())
    fleet.on_record("device", DEVICE, record(10.0))  # approved, its tools not listed yet
    device = stack.registry.get(DEVICE)
    assert device is not None and not device.online
    named = FleetRecord(DEVICE, 11.0, "gw-2", alias="porch", state="approved", catalogue=digest)
    fleet.on_record("device", DEVICE, named.encode())  # its tools named, not here yet
    assert not device.online
    fleet.on_record("catalogue", digest, json.dumps(entries).encode())
    assert device.online and device.exposed and list(device.tools) == ["self.lamp.turn_on"]
    stack.close()


async def test_a_replica_with_another_mqtt_secret_is_named_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Bindings sealed under another key would be refused here: the replica that has another
    ``mqtt_secret`` is named in one error line (not at each heartbeat); the key never is."""
    stack, fleet = fleet_on(tmp_path)
    stack.registry.known.binding_key = b"ours"
    fleet.on_record("replica", "gw-2", ReplicaRecord(2, 1.0, key=key_name(b"ours")).encode())
    fleet.on_record("replica", "gw-3", ReplicaRecord(3, 1.0, key=key_name(b"theirs")).encode())
    fleet.on_record("replica", "gw-3", ReplicaRecord(3, 11.0, key=key_name(b"theirs")).encode())
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "replica gw-3 seals identity bindings with another key" in errors[0]
    assert "mqtt_secret" in errors[0] and set(fleet.live) == {"gw-2", "gw-3"}
    stack.close()


async def test_another_replicas_device_is_callable_here_once_this_replica_has_its_number(
    tmp_path: Path,
) -> None:
    """A replica catching up from its cache knows the records before it has claimed its
    number: it lists another replica's device, and connects it (callable) only once its
    request ids are its own."""
    stack, fleet = fleet_on(tmp_path, numbered=False)
    held_by_gw2(fleet)
    device = stack.registry.get(DEVICE)
    assert device is not None and device.exposed and not device.online
    fleet.numbered()
    assert isinstance(device.session, RemoteSession) and device.session.replica == "gw-2"
    stack.close()


async def _sent(topic: str, payload: bytes, retain: bool = False) -> bool:
    return True  # the broker took it (the device's reply never comes)


@pytest.mark.parametrize("change", ["new session", "owner rejoined"])
async def test_a_direct_call_to_an_mqtt_device_fails_at_once_when_its_session_changes(
    tmp_path: Path, change: str
) -> None:
    """A call in flight to an MQTT device gw-2 owns, made on the device's own topic: the device
    begins a new session (it reconnected, to another node after its own died), or gw-2 lost its
    broker node and joined again; either way what was sent may never be answered, and the call
    fails at once, saying why, not at its 30 s timeout."""
    stack = Stack(make_config(tmp_path, cluster_broker=("mqtt://127.0.0.1:1",)))
    remote = RemoteCalls(TOPICS, id_slice(1), _sent, 65536)
    fleet = Fleet(
        stack.registry,
        TOPICS,
        "gw-1",
        remote,
        Bridge(TOPICS, "gw-1", id_slice(1), _sent),
        device_down=lambda device_id: f"xiaozhi/{device_id}/down",
    )
    fleet.numbered()
    held_by_gw2(fleet, Presence("gw-2", "s1", 1.0, mqtt=True))
    device = stack.registry.get(DEVICE)
    assert device is not None and isinstance(device.session, RemoteSession)
    assert device.session.direct == f"xiaozhi/{DEVICE}/down"
    call = asyncio.create_task(device.session.call("self.lamp.turn_on", {}))
    await asyncio.sleep(0)  # the call is out: sent, waiting for the device's reply
    assert remote.in_flight == 1
    if change == "new session":
        fleet.on_record("presence", DEVICE, Presence("gw-2", "s2", 2.0, mqtt=True).encode())
        why = f"device {DEVICE} began a new session during the call"
    else:
        fleet.on_record("replica", "gw-2", ReplicaRecord(2, 2.0, since=2.0).encode())
        why = "replica gw-2 lost the cluster broker during the call"
    with pytest.raises(DeviceUnavailable, match=why):
        async with asyncio.timeout(bound(1)):
            await call
    stack.close()
