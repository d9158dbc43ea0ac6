"""The fleet as this replica knows it: the state that the fleet's services keep in step.

``FleetState`` holds what the broker's retained records said and what this replica said of its
own devices (the latest ``FleetRecord`` of each device, with when it changed here and when the
broker echoed it), the fleet's catalogues, which replica holds each device (presences), and the
replicas that live. It talks to no broker: ``fleet_records.FleetRecords`` keeps the records in
step with the registry, ``fleet.Fleet`` the remote devices and the replicas.
"""

from __future__ import annotations

from gateway.cluster.catalogues import FleetCatalogues
from gateway.cluster.live import LiveReplicas
from gateway.cluster.records import FleetRecord, Presence
from gateway.devices.registry import Device, KnownDevices

__all__ = ["FleetState"]


class FleetState:
    """The fleet's records, catalogues, presences and live replicas, as this replica knows them."""

    def __init__(self, known: KnownDevices, replica: str) -> None:
        self.replica = replica
        self.replicas = LiveReplicas(replica)
        self.live = self.replicas.records  # the live replicas by name (cleared, never replaced)
        self.records: dict[str, FleetRecord] = {}  # the latest known, ours included
        self.changed: dict[str, float] = {}  # local changes: when (newer wins on rejoin)
        self.echoed: dict[str, float] = {}  # our own records the broker sent back: when
        # What the broker sent since the last (re)join or re-read: what ``repair`` need not say.
        self.on_broker: dict[str, tuple[float, str]] = {}  # device id -> its record's (at, by)
        self.tools = FleetCatalogues(known)
        self.listed: set[str] = set()  # devices whose tools, as the fleet names them, are here
        self.presence: dict[str, Presence] = {}  # which replica holds each device
        self.changes = 0  # of the records known (the cache saves after a change)

    def unsaid(self, device_id: str) -> bool:
        """Does the broker lack this replica's latest word on the device?"""
        known = self.records.get(device_id)
        if known is None:
            return True  # the fleet never heard of it (a device from this data dir's past)
        changed, echoed = self.changed.get(device_id, 0.0), self.echoed.get(device_id, 0.0)
        return known.by == self.replica and changed > echoed  # ours, never came back

    def heard(self, record: FleetRecord) -> None:
        """The broker sent ``record``: it need not be said again (``repair``)."""
        device_id = record.device_id
        self.on_broker[device_id] = max(self.on_broker.get(device_id, (-1.0, "")),
                                        (record.at, record.by))  # fmt: skip
        if record.by == self.replica:  # the broker has it: nothing to publish again
            self.echoed[device_id] = max(record.at, self.echoed.get(device_id, 0.0))

    def reading(self) -> None:
        """The broker is about to send every retained record again: nothing is heard yet."""
        self.on_broker.clear()
        self.tools.on_broker.clear()

    def tools_here(self, device: Device) -> bool:
        """Are the tools the fleet's record names for the device the ones this replica has?"""
        record = self.records.get(device.device_id)
        if record is None or record.catalogue is None:
            return False
        return (
            device.device_id in self.listed
            or self.tools.content(device.device_id) == record.catalogue
        )
