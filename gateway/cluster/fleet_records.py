"""The fleet's records on the broker, kept in step with this replica's registry.

Out: each local change of a device's fleet facts (approval, alias, binding, board, catalogue;
``DeviceRecord``s saved, told by the registry's ``subscribe_records``) becomes a retained
``P/device/<id>`` record, with the catalogue it names under ``P/catalogue/<digest>``; a forgotten
device becomes a tombstone. In: records from other replicas are taken with ``learn()`` (last
writer wins, by the record's time), catalogues with ``set_catalogue()`` (judged again, tool by
tool). After each (re)join, ``repair`` publishes again what the broker lacks; a warm start
takes the records kept in the data dir (cache.py) with ``warm``. What it knows is the fleet
state's (fleet_state.py); the devices other replicas hold are ``Fleet``'s (fleet.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator

from gateway.cluster.fleet_state import FleetState
from gateway.cluster.records import ClusterTopics, FleetRecord, read_catalogue, sealed, unsealed
from gateway.cluster.remote import RemoteSession
from gateway.devices.device import DeviceSession
from gateway.devices.registry import Device, DeviceRegistry
from gateway.devices.store import DeviceRecord

__all__ = ["FleetRecords", "Send"]

logger = logging.getLogger("gateway.cluster.fleet")

Send = Callable[[str, bytes, bool], None]  # (topic, payload, retain): queued for the broker


class FleetRecords:
    """The service that keeps the fleet's device records and catalogues in step with the
    registry: this replica's changes out to the broker, the others' in."""

    def __init__(
        self,
        state: FleetState,
        registry: DeviceRegistry,
        topics: ClusterTopics,
        send: Send,
        attach: Callable[[str], None],
        close: Callable[[DeviceSession], None],
    ) -> None:
        """``attach``: connect a device here if another replica holds it (``Fleet``);
        ``close``: end a local session of a device the fleet forgot."""
        self._state, self._registry, self._topics = state, registry, topics
        self._send, self._attach, self._close = send, attach, close
        self._applying = False
        registry.subscribe_records(self._on_local)

    @contextlib.contextmanager
    def applying(self) -> Iterator[None]:
        """Within: the registry's changes are the broker's own news, nothing to tell it."""
        applying, self._applying = self._applying, True
        try:
            yield
        finally:
            self._applying = applying

    # --- out -------------------------------------------------------------------------------

    def _on_local(self, device_id: str, record: DeviceRecord | None) -> None:
        if self._applying:
            return  # the broker's own news coming back: nothing to tell it
        state, now = self._state, time.time()
        if record is None:
            tomb = FleetRecord(device_id, now, state.replica, forgotten=True)
            state.records[device_id], state.changed[device_id] = tomb, now
            state.changes += 1
            self._send(self._topics.device(device_id), tomb.encode(), True)
            return
        mine = self._record_of(record, now)
        known = state.records.get(device_id)
        if known is not None and known.facts == mine.facts:
            return
        state.records[device_id], state.changed[device_id] = mine, now
        state.changes += 1
        self._tell(mine)

    def _tell(self, mine: FleetRecord) -> None:
        if (entries := self._state.tools.keep(mine.device_id, mine.catalogue)) is not None:
            assert mine.catalogue is not None
            self._send(self._topics.catalogue(mine.catalogue), _json(entries), True)
        self._send(self._topics.device(mine.device_id), mine.encode(), True)

    def _record_of(self, record: DeviceRecord, at: float) -> FleetRecord:
        key = self._registry.binding_key
        seen = sealed(key, record.client_id) if record.binding is None else None
        return FleetRecord(record.device_id, at, self._state.replica, alias=record.alias,
                           state=record.state, board=record.board,
                           binding=sealed(key, record.binding), transport=record.transport,
                           catalogue=self._state.tools.content(record.device_id),
                           server_info=record.server_info, seen=seen)  # fmt: skip

    def repair(self) -> int:
        """After the barrier: publish again every fact this replica holds that the broker does
        not have (lost in a restart before it saved them, a recreated broker) or has older,
        and its own changes the broker never echoed. Returns how many device records."""
        state, tools = self._state, self._state.tools
        now, repaired = time.time(), 0
        for device in self._registry.devices():
            if state.unsaid(device.device_id):  # changed here while cut off, or never said
                mine = state.records[device.device_id] = self._record_of(device.record, now)
                tools.keep(mine.device_id, mine.catalogue)
                state.changes += 1
        for known in state.records.values():
            if not known.forgotten and known.catalogue not in tools.on_broker:
                entries = tools.entries.get(known.catalogue or "")
                if entries is not None:
                    assert known.catalogue is not None
                    tools.on_broker.add(known.catalogue)
                    self._send(self._topics.catalogue(known.catalogue), _json(entries), True)
        for device_id, known in state.records.items():
            if state.on_broker.get(device_id, (-1.0, "")) < (known.at, known.by):
                self._send(self._topics.device(device_id), known.encode(), True)
                repaired += 1
        if repaired:
            logger.info("%s: %d device records the broker lacked published again",
                        state.replica, repaired)  # fmt: skip
        return repaired

    def warm(self, cached: dict[str, FleetRecord]) -> None:
        """Start from the records this replica knew at its last stop (cache.py). One is taken
        when the registry holds what it says (the data dir's SQLite and the cache were written
        apart: a device changed here after the cache's last save is left to the broker, as for
        a cold replica). The broker's records win once heard (newer), and ``repair`` publishes
        again what it lacks: as for a replica that never stopped. The log says how many."""
        state = self._state
        for device_id, record in cached.items():
            device = self._registry.get(device_id)
            if record.forgotten:
                if device is None:
                    state.records[device_id] = record
                continue
            if device is None or _decided(self._record_of(device.record, 0.0)) != _decided(record):
                continue
            state.records[device_id] = record
            if record.catalogue is not None:  # its tools here are the fleet's: listed
                state.tools.keep(device_id, record.catalogue)
                state.listed.add(device_id)
        logger.info("%s: %d of %d cached fleet records taken", state.replica,
                    len(state.records), len(cached))  # fmt: skip

    # --- in: device records and catalogues ------------------------------------------------

    def on_device(self, device_id: str, payload: bytes) -> None:
        """Take a device's retained record (an empty payload clears it: nothing to take)."""
        if not payload:
            return
        state = self._state
        record = FleetRecord.read(device_id, payload)
        state.heard(record)
        known = state.records.get(device_id)
        if known is not None and (record.at, record.by) <= (known.at, known.by):
            return  # ours coming back, or older than what we know
        if state.changed.get(device_id, 0.0) > record.at:
            return  # changed here since (while cut off): ours is published on rejoining
        state.records[device_id] = record
        state.changes += 1
        logger.debug("%s: device record %s from %s: %s", state.replica, device_id, record.by,
                     record.facts)  # fmt: skip
        with self.applying():
            self._apply(record)

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

    def _take_catalogue(self, device: Device, record: FleetRecord) -> None:
        state = self._state
        state.listed.discard(device.device_id)
        if record.catalogue is None:
            return
        if state.tools.content(device.device_id) == record.catalogue:
            state.listed.add(device.device_id)
            return
        if device.session is not None and not isinstance(device.session, RemoteSession):
            return  # a session here lists its tools itself
        entries = state.tools.entries.get(record.catalogue)
        logger.debug("%s: catalogue %s for %s: %s", state.replica, record.catalogue[:8],
                     device.device_id, "known" if entries else "awaited")  # fmt: skip
        if entries is None:
            state.tools.waiting.setdefault(record.catalogue, set()).add(device.device_id)
            return
        self._registry.set_catalogue(device.device_id, entries, record.server_info)
        state.listed.add(device.device_id)

    def on_catalogue(self, digest: str, payload: bytes) -> None:
        """Take a catalogue's retained record; the devices waiting for it get their tools."""
        if not payload:
            return
        tools = self._state.tools
        if digest not in tools.entries:
            tools.entries[digest] = read_catalogue(digest, payload)
        tools.on_broker.add(digest)
        for device_id in tools.waiting.pop(digest, set()):
            device, record = self._registry.get(device_id), self._state.records.get(device_id)
            if device is not None and record is not None and record.catalogue == digest:
                with self.applying():
                    self._take_catalogue(device, record)
                    self._attach(device_id)


def _decided(record: FleetRecord) -> tuple[object, ...]:
    """What a record says that the registry must hold as said (its board and transport, a
    replica may learn again itself)."""
    return record.alias, record.state, record.binding, record.seen, record.catalogue


def _json(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()
