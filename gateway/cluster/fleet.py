"""Fleet state on the broker: every replica's registry follows the retained records.

``Fleet`` is the service that keeps this replica's part of the fleet state (fleet_state.py) in
step with the broker, composed of its parts: the device records and catalogues, in and out,
are ``FleetRecords``' (fleet_records.py). Here: a WebSocket device another replica holds
(``P/presence/<id>``, while that replica lives) is connected here through a ``RemoteSession``;
it goes offline here when its presence is cleared, when its replica's record goes (last will,
or silence past ``SILENT_AFTER``: live.py), or when this replica loses the broker. Each bad
record is refused alone, with a log line.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from gateway.cluster.bridge import Bridge
from gateway.cluster.fleet_records import FleetRecords
from gateway.cluster.fleet_state import FleetState
from gateway.cluster.live import CALLS_SILENT_AFTER, SILENT_AFTER, LiveReplicas
from gateway.cluster.records import (
    BadRecord,
    ClusterTopics,
    FleetRecord,
    Presence,
    ReplicaRecord,
    key_name,
)
from gateway.cluster.remote import RemoteCalls, RemoteSession
from gateway.devices.device import APPROVED, DeviceSession
from gateway.devices.link import BOARD_TRANSPORT
from gateway.devices.registry import DeviceRegistry

__all__ = ["Fleet"]

logger = logging.getLogger(__name__)


class Fleet:
    """This replica's view of the fleet on the broker, kept in step with its registry: the
    records (``FleetRecords``), the devices other replicas hold, and the replicas that live."""

    def __init__(
        self,
        registry: DeviceRegistry,
        topics: ClusterTopics,
        replica: str,
        remote: RemoteCalls,
        bridge: Bridge,
        *,
        device_down: Callable[[str], str] | None = None,
        gives_way: Callable[[str, Presence], bool] | None = None,
        live_changed: Callable[[], None] | None = None,
    ) -> None:
        """``device_down``: an MQTT device's own down topic (a device owned elsewhere is called
        there); ``gives_way``: does the session here give way to the one a presence names?;
        ``live_changed``: told when the live replicas change (who owns which session)."""
        self.replica = replica
        self.state = FleetState(registry.known, replica)
        self._registry = registry
        self._topics = topics
        self._remote = remote
        self._bridge = bridge
        self._presence = self.state.presence
        self._closing: set[asyncio.Task[None]] = set()
        self.outbox: asyncio.Queue[tuple[str, bytes, bool]] = asyncio.Queue()
        self._records = FleetRecords(self.state, registry, topics, self._send, self._attach,
                                     self._close)  # fmt: skip
        # Until this replica has its number it cannot call another's devices (its request
        # ids would be another replica's): they are attached once it has (``numbered``).
        self.calls_ready = False
        self.live_changed = live_changed or (lambda: None)
        self.device_down = device_down
        self.gives_way = gives_way or (lambda device_id, presence: False)

    # --- the state, as the cluster and its cache read it -----------------------------------

    @property
    def replicas(self) -> LiveReplicas:
        return self.state.replicas

    @property
    def live(self) -> dict[str, ReplicaRecord]:
        """The live replicas by name (cleared, never replaced)."""
        return self.state.live

    @property
    def records(self) -> dict[str, FleetRecord]:
        """The latest record known of each device (the cache's content)."""
        return self.state.records

    @property
    def changes(self) -> int:
        """Changes of the records known so far (the cache saves after one)."""
        return self.state.changes

    # --- out -------------------------------------------------------------------------------

    def _send(self, topic: str, payload: bytes, retain: bool) -> None:
        self.outbox.put_nowait((topic, payload, retain))

    def _close(self, session: DeviceSession) -> None:
        self._closing.add(task := asyncio.get_running_loop().create_task(session.aclose()))
        task.add_done_callback(self._closing.discard)

    def rejoined(self) -> None:
        """After (re)joining: tell the broker what it lacks or what changed here meanwhile."""
        self.repair()
        for device_id, session in self._bridge.held().items():
            self._bridge.announce(device_id, session)

    def reading(self) -> None:
        """The broker is about to send every retained record again (a join, a re-read): note
        afresh which ones it has, for ``repair``."""
        self.state.reading()

    def repair(self) -> int:
        """Publish again what the broker lacks (``FleetRecords.repair``); how many records."""
        return self._records.repair()

    def warm(self, cached: dict[str, FleetRecord]) -> None:
        """Start from the records kept at the last stop (``FleetRecords.warm``)."""
        self._records.warm(cached)

    # --- in --------------------------------------------------------------------------------

    def on_record(self, kind: str, key: str, payload: bytes) -> None:
        """Take one retained record (an empty payload clears it)."""
        try:
            if kind == "device":
                self._records.on_device(key, payload)
            elif kind == "catalogue":
                self._records.on_catalogue(key, payload)
            elif kind == "presence":
                self._on_presence(key, payload)
            elif kind == "replica":
                self._on_replica(key, payload)
        except BadRecord as exc:
            logger.warning("cluster: %s record %s refused: %s", kind, key[:80], exc)

    def announced_here(self, device_id: str) -> bool:
        """Does the device's presence record name this replica (or no replica)?"""
        presence = self._presence.get(device_id)
        return presence is None or presence.replica == self.replica

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
        before = self._presence.get(device_id)
        self._presence[device_id] = presence
        if before is not None and before.replica == presence.replica != self.replica \
                and before.session != presence.session:  # fmt: skip
            # Its owner runs a new session: the device reconnected (perhaps to another node,
            # after its own died), and what was sent to it before may never be answered. (A
            # new owner is no new connection: an MQTT device's calls go on across owners.)
            self._remote.fail(f"device {device_id} began a new session during the call",
                              device_id=device_id)  # fmt: skip
        if presence.replica == self.replica and not self._bridge.holds(device_id):
            self._send(self._topics.presence(device_id), b"", True)  # a past life's
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
            why = f"replica {name} lost the cluster broker during the call"
            self._remote.fail(why, replica=name)
            # Calls made directly to the MQTT devices it owns too: its node may have been the
            # devices' own (their replies lost with it), and it runs their sessions afresh.
            for device_id, presence in list(self._presence.items()):
                if presence.replica == name and presence.mqtt:
                    self._remote.fail(why, device_id=device_id)
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

    def numbered(self) -> None:
        """This replica has its number: it may call the devices the others hold."""
        self.calls_ready = True
        for device_id in list(self._presence):
            self._attach(device_id)

    def _attach(self, device_id: str) -> None:
        presence = self._presence.get(device_id)
        device = self._registry.get(device_id)
        if presence is None or device is None or presence.replica not in self.live:
            return
        if not self.calls_ready:
            return  # attached once this replica has its number (``numbered``)
        if presence.replica == self.replica:
            return
        if device.record.state == APPROVED and not self.state.tools_here(device):
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
        with self._records.applying():
            self._registry.connect(device_id, remote, transport=transport)
        if handed and session is not None:  # its new owner runs it: this session ends now
            self._close(session)

    def _detach(self, device_id: str, why: str, *, owner_gone: bool = False) -> None:
        device = self._registry.get(device_id)
        session = device.session if device is not None else None
        if isinstance(session, RemoteSession):
            logger.debug("%s: device %s no longer reached through replica %s: %s",
                         self.replica, device_id, session.replica, why)  # fmt: skip
            with self._records.applying():
                self._registry.disconnect(device_id, session)
            if owner_gone and session.direct:
                # An MQTT device outlives its owner: calls in flight go on (their replies come
                # on its own topic), and the next owner announces it again.
                return
        self._remote.fail(why, device_id=device_id)

    def local_ended(self, device_id: str) -> None:
        """A local link of the device ended, or its session moved: another may hold it now."""
        self._attach(device_id)
