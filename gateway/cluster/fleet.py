"""Fleet state on the broker: every replica's registry follows the retained records.

Out: each local change of a device's fleet facts (approval, alias, binding, board, catalogue;
``DeviceRecord``s saved, through the registry's ``record_watchers``) becomes a retained
``P/device/<id>`` record, with the catalogue it names under ``P/catalogue/<digest>``; a forgotten
device becomes a tombstone. In: records from other replicas are taken with ``learn()`` (last
writer wins, by the record's time), catalogues with ``set_catalogue()`` (judged again, tool by
tool). A WebSocket device another replica holds (``P/presence/<id>``, while that replica lives)
is connected here through a ``RemoteSession``; it goes offline here when its presence is cleared,
when its replica's record goes (last will, or silence past ``SILENT_AFTER``: live.py), or when
this replica loses the broker. Each bad record is refused alone, with a log line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable

from gateway.cluster.bridge import Bridge
from gateway.cluster.catalogues import FleetCatalogues
from gateway.cluster.live import CALLS_SILENT_AFTER, SILENT_AFTER, LiveReplicas
from gateway.cluster.records import (
    BadRecord,
    ClusterTopics,
    FleetRecord,
    Presence,
    ReplicaRecord,
    key_name,
    read_catalogue,
    sealed,
    unsealed,
)
from gateway.cluster.remote import RemoteCalls, RemoteSession
from gateway.devices.device import APPROVED, DeviceSession
from gateway.devices.link import BOARD_TRANSPORT
from gateway.devices.registry import Device, DeviceRegistry
from gateway.devices.store import DeviceRecord

__all__ = ["Fleet"]

logger = logging.getLogger(__name__)

Publish = Callable[[str, bytes, bool], Awaitable[bool]]


class Fleet:
    """This replica's view of the fleet on the broker, kept in step with its registry."""

    def __init__(self, registry: DeviceRegistry, topics: ClusterTopics, replica: str,
                 remote: RemoteCalls, bridge: Bridge) -> None:  # fmt: skip
        self.replica = replica
        self.replicas = LiveReplicas(replica)
        self.live = self.replicas.records  # the live replicas by name (cleared, never replaced)
        self._registry = registry
        self._topics = topics
        self._remote = remote
        self._bridge = bridge
        self._records: dict[str, FleetRecord] = {}  # the latest known, ours included
        self._changed: dict[str, float] = {}  # local changes: when (newer wins on rejoin)
        self._echoed: dict[str, float] = {}  # our own records the broker sent back: when
        self._tools = FleetCatalogues(registry)
        self._listed: set[str] = set()  # devices whose tools, as the fleet names them, are here
        self._presence: dict[str, Presence] = {}
        # What the broker sent since the last (re)join or re-read: what ``repair`` need not say.
        self._on_broker: dict[str, tuple[float, str]] = {}  # device id -> its record's (at, by)
        self._applying = False
        self._closing: set[asyncio.Task[None]] = set()
        # ownership of sessions (MQTT devices, boards): told when the live replicas change; a
        # device's own down topic (an MQTT device owned elsewhere is called there); does the
        # session here give way to the one a presence names?
        self.live_changed: Callable[[], None] = lambda: None
        self.device_down: Callable[[str], str] | None = None
        self.gives_way: Callable[[str, Presence], bool] = lambda device_id, presence: False
        self.outbox: asyncio.Queue[tuple[str, bytes, bool]] = asyncio.Queue()
        registry.record_watchers.append(self._on_local)

    # --- out -------------------------------------------------------------------------------

    def _on_local(self, device_id: str, record: DeviceRecord | None) -> None:
        if self._applying:
            return  # the broker's own news coming back: nothing to tell it
        now = time.time()
        if record is None:
            tomb = FleetRecord(device_id, now, self.replica, forgotten=True)
            self._records[device_id], self._changed[device_id] = tomb, now
            self._send(self._topics.device(device_id), tomb.encode(), retain=True)
            return
        mine = self._record_of(record, now)
        known = self._records.get(device_id)
        if known is not None and known.facts == mine.facts:
            return
        self._records[device_id], self._changed[device_id] = mine, now
        self._tell(mine)

    def _tell(self, mine: FleetRecord) -> None:
        if (entries := self._tools.keep(mine.device_id, mine.catalogue)) is not None:
            assert mine.catalogue is not None
            self._send(self._topics.catalogue(mine.catalogue), _json(entries), retain=True)
        self._send(self._topics.device(mine.device_id), mine.encode(), retain=True)

    def _record_of(self, record: DeviceRecord, at: float) -> FleetRecord:
        key = self._registry.binding_key
        seen = sealed(key, record.client_id) if record.binding is None else None
        return FleetRecord(record.device_id, at, self.replica, alias=record.alias,
                           state=record.state, board=record.board,
                           binding=sealed(key, record.binding), transport=record.transport,
                           catalogue=self._tools.content(record.device_id),
                           server_info=record.server_info, seen=seen)  # fmt: skip

    def _send(self, topic: str, payload: bytes, *, retain: bool) -> None:
        self.outbox.put_nowait((topic, payload, retain))

    def rejoined(self) -> None:
        """After (re)joining: tell the broker what it lacks or what changed here meanwhile."""
        self.repair()
        for device_id, session in self._bridge.held().items():
            self._bridge.announce(device_id, session)

    def reading(self) -> None:
        """The broker is about to send every retained record again (a join, a re-read): note
        afresh which ones it has, for ``repair``."""
        self._on_broker.clear()
        self._tools.on_broker.clear()

    def repair(self) -> int:
        """After the barrier: publish again every fact this replica holds that the broker does
        not have (lost in a restart before it saved them, a recreated broker) or has older,
        and its own changes the broker never echoed. Returns how many device records."""
        now, repaired = time.time(), 0
        for device in self._registry.devices():
            if self._unsaid(device.device_id):  # changed here while cut off, or never said
                mine = self._records[device.device_id] = self._record_of(device.record, now)
                self._tools.keep(mine.device_id, mine.catalogue)
        for known in self._records.values():
            if not known.forgotten and known.catalogue not in self._tools.on_broker:
                entries = self._tools.entries.get(known.catalogue or "")
                if entries is not None:
                    assert known.catalogue is not None
                    self._tools.on_broker.add(known.catalogue)
                    self._send(self._topics.catalogue(known.catalogue), _json(entries), retain=True)
        for device_id, known in self._records.items():
            if self._on_broker.get(device_id, (-1.0, "")) < (known.at, known.by):
                self._send(self._topics.device(device_id), known.encode(), retain=True)
                repaired += 1
        if repaired:
            logger.info("%s: %d device records the broker lacked published again", self.replica,
                        repaired)  # fmt: skip
        return repaired

    def _unsaid(self, device_id: str) -> bool:
        """Does the broker lack this replica's latest word on the device?"""
        known = self._records.get(device_id)
        if known is None:
            return True  # the fleet never heard of it (a device from this data dir's past)
        changed, echoed = self._changed.get(device_id, 0.0), self._echoed.get(device_id, 0.0)
        return known.by == self.replica and changed > echoed  # ours, never came back

    # --- in --------------------------------------------------------------------------------

    def on_record(self, kind: str, key: str, payload: bytes) -> None:
        """Take one retained record (an empty payload clears it)."""
        try:
            if kind == "device":
                self._on_device(key, payload)
            elif kind == "catalogue":
                self._on_catalogue(key, payload)
            elif kind == "presence":
                self._on_presence(key, payload)
            elif kind == "replica":
                self._on_replica(key, payload)
        except BadRecord as exc:
            logger.warning("cluster: %s record %s refused: %s", kind, key[:80], exc)

    def _on_device(self, device_id: str, payload: bytes) -> None:
        if not payload:
            return
        record = FleetRecord.read(device_id, payload)
        self._on_broker[device_id] = max(self._on_broker.get(device_id, (-1.0, "")),
                                         (record.at, record.by))  # fmt: skip
        if record.by == self.replica:  # the broker has it: nothing to publish again
            self._echoed[device_id] = max(record.at, self._echoed.get(device_id, 0.0))
        known = self._records.get(device_id)
        if known is not None and (record.at, record.by) <= (known.at, known.by):
            return  # ours coming back, or older than what we know
        if self._changed.get(device_id, 0.0) > record.at:
            return  # changed here since (while cut off): ours is published on rejoining
        self._records[device_id] = record
        logger.debug("%s: device record %s from %s: %s", self.replica, device_id, record.by,
                     record.facts)  # fmt: skip
        self._applying = True
        try:
            self._apply(record)
        finally:
            self._applying = False

    def _apply(self, record: FleetRecord) -> None:
        device = self._registry.get(record.device_id)
        if record.forgotten:
            if device is not None:
                self._forget(device)
            return
        local, key = device.record if device is not None else None, self._registry.binding_key
        device = self._registry.learn(DeviceRecord(
            device_id=record.device_id, alias=record.alias, board=record.board,
            transport=record.transport, state=record.state,
            binding=unsealed(key, record.binding, local),
            client_id=unsealed(key, record.seen, local),
            server_info=record.server_info, first_seen=record.at, last_seen=record.at))  # fmt: skip
        self._take_catalogue(device, record)
        self._attach(record.device_id)

    def _forget(self, device: Device) -> None:
        session = device.session
        self._registry.forget(device)
        if session is not None and not isinstance(session, RemoteSession):
            self._close(session)

    def _close(self, session: DeviceSession) -> None:
        self._closing.add(task := asyncio.get_running_loop().create_task(session.aclose()))
        task.add_done_callback(self._closing.discard)

    def announced_here(self, device_id: str) -> bool:
        """Does the device's presence record name this replica (or no replica)?"""
        presence = self._presence.get(device_id)
        return presence is None or presence.replica == self.replica

    def _take_catalogue(self, device: Device, record: FleetRecord) -> None:
        self._listed.discard(device.device_id)
        if record.catalogue is None:
            return
        if self._tools.content(device.device_id) == record.catalogue:
            self._listed.add(device.device_id)
            return
        if device.session is not None and not isinstance(device.session, RemoteSession):
            return  # a session here lists its tools itself
        entries = self._tools.entries.get(record.catalogue)
        logger.debug("%s: catalogue %s for %s: %s", self.replica, record.catalogue[:8],
                     device.device_id, "known" if entries else "awaited")  # fmt: skip
        if entries is None:
            self._tools.waiting.setdefault(record.catalogue, set()).add(device.device_id)
            return
        self._registry.set_catalogue(device.device_id, entries, record.server_info)
        self._listed.add(device.device_id)

    def _on_catalogue(self, digest: str, payload: bytes) -> None:
        if not payload:
            return
        if digest not in self._tools.entries:
            self._tools.entries[digest] = read_catalogue(digest, payload)
        self._tools.on_broker.add(digest)
        for device_id in self._tools.waiting.pop(digest, set()):
            device, record = self._registry.get(device_id), self._records.get(device_id)
            if device is not None and record is not None and record.catalogue == digest:
                self._applying = True
                try:
                    self._take_catalogue(device, record)
                    self._attach(device_id)
                finally:
                    self._applying = False

    def _on_presence(self, device_id: str, payload: bytes) -> None:
        if not payload:
            if (session := self._bridge.session_of(device_id)) is not None:
                # Cleared by the replica that held it before (an MQTT device handed over as
                # replicas come and go): it is here now, say so again.
                self._bridge.announce(device_id, session)
            gone = self._presence.pop(device_id, None)
            if gone is not None and gone.replica != self.replica:
                self._detach(device_id, f"device {device_id} left replica {gone.replica}")
            return
        presence = Presence.read(payload)
        self._presence[device_id] = presence
        if presence.replica == self.replica and not self._bridge.holds(device_id):
            self._send(self._topics.presence(device_id), b"", retain=True)  # a past life's
            return
        self._attach(device_id)

    def _on_replica(self, name: str, payload: bytes) -> None:
        if not payload:
            self._replica_gone(name, f"replica {name} went away")
            return
        record = ReplicaRecord.read(payload)
        known = self.replicas.hear(name, record)
        new = known is None
        if known is not None and known.since != record.since:  # it lost the broker meanwhile
            self._remote.fail(f"replica {name} lost the cluster broker during the call",
                              replica=name)  # fmt: skip
        if new and record.key not in (None, key_name(self._registry.binding_key)):
            logger.error("replica %s seals identity bindings with another key: every replica "
                         "needs the same data_dir/mqtt_secret (docs/cluster.md); until then a "
                         "device bound on one is refused on the other", name)  # fmt: skip
        if new:
            for device_id, presence in list(self._presence.items()):
                if presence.replica == name:
                    self._attach(device_id)
            self.live_changed()

    def _replica_gone(self, name: str, why: str) -> None:
        self.replicas.drop(name)
        for device_id, presence in list(self._presence.items()):
            if presence.replica == name:
                self._detach(device_id, f"{why} with device {device_id}", owner_gone=True)
        self._remote.fail(f"{why} during the call", replica=name)
        self.live_changed()

    def expire(self) -> list[str]:
        """Forget the replicas silent for too long (a will lost in a broker restart); their
        names, so that their stale records are cleared."""
        silent = self.replicas.silent(SILENT_AFTER)
        for name in silent:
            self._replica_gone(name, f"replica {name} fell silent")
        return silent

    def fail_silent(self) -> None:
        """Fail the calls through the replicas silent for ``CALLS_SILENT_AFTER`` seconds: they
        are cut off, or died with the broker node that held their will."""
        for name in self.replicas.silent(CALLS_SILENT_AFTER):
            self._remote.fail(f"replica {name} fell silent during the call", replica=name)

    def lost(self) -> None:
        """This replica lost the broker: what it reached through it is unreachable now."""
        why = "this replica is cut from the cluster broker"
        in_flight = self._remote.in_flight
        for device_id in list(self._presence):
            self._detach(device_id, why)
        self._presence.clear()
        self.replicas.clear()
        self._remote.fail(why)
        self.reading()  # the broker sends everything again when this replica is back
        self.live_changed()
        logger.warning("%s: lost the cluster broker; %d calls through it failed", self.replica,
                       in_flight)  # fmt: skip

    # --- remote devices --------------------------------------------------------------------

    def _attach(self, device_id: str) -> None:
        presence = self._presence.get(device_id)
        device = self._registry.get(device_id)
        if presence is None or device is None or presence.replica not in self.live:
            return
        if presence.replica == self.replica:
            return
        if device.record.state == APPROVED and not self._tools_here(device):
            return  # listed once its tools are known here: hosts never see it without them
        session = device.session
        handed = session is not None and not isinstance(session, RemoteSession)
        if handed and not self.gives_way(device_id, presence):
            return  # it is connected here too, and stays: the local link wins
        named = (presence.replica, presence.session)
        if isinstance(session, RemoteSession) and (session.replica, session.session) == named:
            return  # the session it names already
        down = self.device_down if presence.mqtt else None
        remote = RemoteSession(self._remote, device_id, presence.replica, presence.session,
                               down(device_id) if down else None)  # fmt: skip
        kind = "mqtt" if down else "websocket"  # a board stays one (list_devices says so)
        transport = BOARD_TRANSPORT if device.record.transport == BOARD_TRANSPORT else kind
        applying, self._applying = self._applying, True
        try:
            self._registry.connect(device_id, remote, transport=transport)
        finally:
            self._applying = applying
        if handed and session is not None:  # its new owner runs it: this session ends now
            self._close(session)

    def _tools_here(self, device: Device) -> bool:
        """Are the tools the fleet's record names for the device the ones this replica has?"""
        record = self._records.get(device.device_id)
        if record is None or record.catalogue is None:
            return False
        return (
            device.device_id in self._listed
            or self._tools.content(device.device_id) == record.catalogue
        )

    def _detach(self, device_id: str, why: str, *, owner_gone: bool = False) -> None:
        device = self._registry.get(device_id)
        session = device.session if device is not None else None
        if isinstance(session, RemoteSession):
            applying, self._applying = self._applying, True
            try:
                self._registry.disconnect(device_id, session)
            finally:
                self._applying = applying
            if owner_gone and session.direct:
                # An MQTT device outlives its owner: calls in flight go on (their replies come
                # on its own topic), and the next owner announces it again.
                return
        self._remote.fail(why, device_id=device_id)

    def local_ended(self, device_id: str) -> None:
        """A local link of the device ended, or its session moved: another may hold it now."""
        self._attach(device_id)


def _json(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()
