"""Fleet state on the broker, the records' part: every replica's registry follows them.

Out: each local change of a device's fleet facts (approval, alias, binding, board, catalogue;
``DeviceRecord``s saved, through the registry's ``record_watchers``) becomes a retained
``P/device/<id>`` record, with the catalogue it names under ``P/catalogue/<digest>``; a forgotten
device becomes a tombstone. In: records from other replicas are taken with ``learn()`` (last
writer wins, by the record's time), catalogues with ``set_catalogue()`` (judged again, tool by
tool). After each (re)join, ``repair`` publishes again what the broker lacks; a warm start
takes the records kept in the data dir (cache.py) with ``warm``. ``Fleet`` (fleet.py) adds the
devices other replicas hold and the replicas themselves.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable

from gateway.cluster.bridge import Bridge
from gateway.cluster.catalogues import FleetCatalogues
from gateway.cluster.live import LiveReplicas
from gateway.cluster.records import (
    ClusterTopics,
    FleetRecord,
    Presence,
    read_catalogue,
    sealed,
    unsealed,
)
from gateway.cluster.remote import RemoteCalls, RemoteSession
from gateway.devices.device import DeviceSession
from gateway.devices.registry import Device, DeviceRegistry
from gateway.devices.store import DeviceRecord

__all__ = ["FleetState"]

logger = logging.getLogger("gateway.cluster.fleet")


class FleetState:
    """The fleet's records as this replica knows them, kept in step with its registry."""

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
        self.changes = 0  # of the records known (the cache saves after a change)
        self.read = 0  # device records parsed from the broker so far
        # Until this replica has its number it cannot call another's devices (its request
        # ids would be another replica's): they are attached once it has (``numbered``).
        self.calls_ready = False
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
            self.changes += 1
            self._send(self._topics.device(device_id), tomb.encode(), retain=True)
            return
        mine = self._record_of(record, now)
        known = self._records.get(device_id)
        if known is not None and known.facts == mine.facts:
            return
        self._records[device_id], self._changed[device_id] = mine, now
        self.changes += 1
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
                self.changes += 1
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

    @property
    def records(self) -> dict[str, FleetRecord]:
        """The latest record known of each device (the cache's content)."""
        return self._records

    def warm(self, cached: dict[str, FleetRecord]) -> int:
        """Start from the records this replica knew at its last stop (cache.py); how many it
        took. One is taken when the registry holds what it says (the data dir's SQLite and the
        cache were written apart: a device changed here after the cache's last save is left to
        the broker, as for a cold replica). The broker's records win once heard (newer), and
        ``repair`` publishes again what it lacks: as for a replica that never stopped."""
        for device_id, record in cached.items():
            device = self._registry.get(device_id)
            if record.forgotten:
                if device is None:
                    self._records[device_id] = record
                continue
            if device is None or _decided(self._record_of(device.record, 0.0)) != _decided(record):
                continue
            self._records[device_id] = record
            if record.catalogue is not None:  # its tools here are the fleet's: listed
                self._tools.keep(device_id, record.catalogue)
                self._listed.add(device_id)
        logger.info("%s: %d of %d cached fleet records taken", self.replica, len(self._records),
                    len(cached))  # fmt: skip
        return len(self._records)

    # --- in: device records and catalogues ------------------------------------------------

    def _on_device(self, device_id: str, payload: bytes) -> None:
        if not payload:
            return
        self.read += 1
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
        self.changes += 1
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
        device = self._registry.admin.learn(DeviceRecord(
            device_id=record.device_id, alias=record.alias, board=record.board,
            transport=record.transport, state=record.state,
            binding=unsealed(key, record.binding, local),
            client_id=unsealed(key, record.seen, local),
            server_info=record.server_info, first_seen=record.at, last_seen=record.at))  # fmt: skip
        self._take_catalogue(device, record)
        self._attach(record.device_id)

    def _forget(self, device: Device) -> None:
        session = device.session
        self._registry.admin.forget(device)
        if session is not None and not isinstance(session, RemoteSession):
            self._close(session)

    def _close(self, session: DeviceSession) -> None:
        self._closing.add(task := asyncio.get_running_loop().create_task(session.aclose()))
        task.add_done_callback(self._closing.discard)

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

    def _attach(self, device_id: str) -> None:
        """Connect the device here if another replica holds it (fleet.py)."""
        raise NotImplementedError


def _decided(record: FleetRecord) -> tuple[object, ...]:
    """What a record says that the registry must hold as said (its board and transport, a
    replica may learn again itself)."""
    return record.alias, record.state, record.binding, record.seen, record.catalogue


def _json(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()
