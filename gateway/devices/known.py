"""The devices the gateway knows: the registry's state, and the queries on it.

``KnownDevices`` loads the devices, catalogues and names from the SQLite store, answers queries
(by id, by alias, what hosts see), and keeps its indexes (aliases, the order, the exposure) in
step through the few changes it offers: a device made or removed, renamed, given a catalogue,
shown or hidden, saved. It decides nothing: the services that act on it do, each handed it at
construction: the user's decisions (``admin.DeviceAdmin``), the connections' updates
(``registry.DeviceRegistry``), the policy's verdicts on a catalogue (``decisions.ToolDecisions``).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Protocol

from gateway.config import Config
from gateway.devices.audit import AuditLog
from gateway.devices.broadcast import Broadcast
from gateway.devices.catalogue import Catalogue, Catalogues
from gateway.devices.decisions import ToolDecisions
from gateway.devices.device import APPROVED, PENDING, Device, DeviceTool
from gateway.devices.exposure import Changes, Exposure
from gateway.devices.fleet_naming import FleetNames
from gateway.devices.link import BOARD_TRANSPORT
from gateway.devices.naming import NameMap, clean_alias, derive_alias
from gateway.devices.pages import KnownPages
from gateway.devices.store import DeviceRecord, Store
from gateway.devices.subscribers import Subscribers, Unsubscribe

__all__ = ["DeviceView", "KnownDevices"]


logger = logging.getLogger(__name__)


class DeviceView(Protocol):
    """The known devices as the host side reads them: queries and change streams, no change.
    (Changes are the services': the user's through ``DeviceAdmin``, the connections' through
    ``DeviceRegistry``.) ``KnownDevices`` is one."""

    def devices(self) -> Sequence[Device]: ...
    def devices_after(self, key: tuple[str, str] | None) -> Iterator[Device]: ...
    def get(self, device_id: str) -> Device | None: ...
    def find(self, ref: str) -> Device | None: ...
    def exposed_tools(self) -> Sequence[DeviceTool]: ...
    def lookup(self, name: str) -> DeviceTool | None: ...
    def changes(self) -> Changes: ...
    def changed_since(self, mark: int) -> tuple[Sequence[Device] | None, int]: ...
    @property
    def version(self) -> int: ...
    def device_changes(self) -> Changes: ...
    def holder(self, alias: str) -> Device | None: ...
    def subscribe_discoveries(self, callback: Callable[[float], object]) -> Unsubscribe: ...
    @property
    def online_count(self) -> int: ...
    @property
    def waiting(self) -> Mapping[str, Device]: ...
    @property
    def audit(self) -> AuditLog: ...


class KnownDevices:
    """Devices, catalogues and names, persisted in the data dir's SQLite store."""

    def __init__(
        self,
        config: Config,
        store: Store,
        clock: Callable[[], float] = time.time,
        audit: AuditLog | None = None,
        decisions: ToolDecisions | None = None,
        binding_key: bytes | None = None,
    ) -> None:
        """``binding_key``: cluster: the key of the identity bindings other replicas decide
        (sealed, tokens.seal); None outside a cluster."""
        self.config = config
        self.store = store
        self.clock = clock
        self.catalogues = Catalogues()
        self._decide = decisions or ToolDecisions(config)
        self.pages = KnownPages()  # shared by every device session's protocol
        self._exposure = Exposure()
        self._device_changes: Broadcast[None] = Broadcast()
        self._devices: dict[str, Device] = {}
        self._by_alias: dict[str, Device] = {}
        # Every device ordered by (alias, id), sorted once and then kept in order as devices
        # are added, forgotten or renamed: the device list is read page by page (the HTTP API,
        # the dashboard, list_devices), and a fleet of 50,000 must not be sorted again for every
        # page, nor after every join.
        self._order: list[Device] | None = None
        self.online_count = 0
        # Admin actions and refused logins go to the audit log (who, what, from where).
        self.audit = audit or AuditLog(None)
        self.waiting: dict[str, Device] = {}  # the pending devices, at most [devices] max_pending
        # Pending boards (found over mDNS) wait apart: they never take a stock device's place;
        # the discovery caps them ([mcp_boards] discover_max_pending).
        self.waiting_boards: dict[str, Device] = {}
        # Told how long each discovery took (seconds from connecting to a listed catalogue).
        self._discoveries: Subscribers[[float]] = Subscribers()
        # Told of each record saved (the device id and its record) or forgotten (None).
        self._records: Subscribers[[str, DeviceRecord | None]] = Subscribers()
        self.binding_key = binding_key
        stored = store.load()
        # cluster: names by the fleet rule, which needs no history (fleet_naming.py)
        self._fleet_names = FleetNames() if config.cluster_broker else None
        self._names: NameMap | FleetNames = self._fleet_names or NameMap(stored.names)
        catalogues = self.catalogues.load(stored.catalogues)
        for record in stored.devices:
            configured = config.device(record.device_id).name
            if configured and clean_alias(configured) != record.alias:
                record.alias = clean_alias(configured)  # the config renamed it since the last run
                store.save_device(record)
            device = self._devices[record.device_id] = Device(record)
            self._by_alias.setdefault(record.alias, device)
            if record.state == PENDING:
                self.queue(record)[record.device_id] = device
            if record.catalogue is not None and record.catalogue not in catalogues:
                record.catalogue = None  # unreadable: the device lists its tools again anyway
                store.save_device(record)
            if record.catalogue is not None:
                self.use(device, catalogues[record.catalogue])

    def queue(self, record: DeviceRecord) -> dict[str, Device]:
        """Where a pending device waits: ``waiting_boards`` for a board, else ``waiting``."""
        return self.waiting_boards if record.transport == BOARD_TRANSPORT else self.waiting

    def unwait(self, device_id: str) -> None:
        """``device_id`` no longer waits for approval (approved, rejected, forgotten)."""
        self.waiting.pop(device_id, None)
        self.waiting_boards.pop(device_id, None)

    # --- queries ---------------------------------------------------------------------------

    def devices(self) -> Sequence[Device]:
        """Every known device, ordered by alias (a stable order keeps hosts' caches warm)."""
        return self._ordered()

    def devices_after(self, key: tuple[str, str] | None) -> Iterator[Device]:
        """The devices ordered after ``key`` (an alias and a device id), or all when None:
        where the next page of a device listing starts, found without looking at the others."""
        devices = self._ordered()
        start = 0 if key is None else bisect.bisect_right(devices, key, key=_order_key)
        return (devices[index] for index in range(start, len(devices)))

    def _ordered(self) -> list[Device]:
        if self._order is None:
            self._order = sorted(self._devices.values(), key=_order_key)
        return self._order

    def _order_add(self, device: Device) -> None:
        """Put ``device`` in the kept order (if kept): a join moves no other device."""
        if self._order is not None:
            bisect.insort(self._order, device, key=_order_key)

    def _order_drop(self, device: Device) -> None:
        """Take ``device`` out of the kept order (if kept), under the alias it has now."""
        order = self._order
        if order is not None:
            index = bisect.bisect_left(order, _order_key(device), key=_order_key)
            if index < len(order) and order[index] is device:
                del order[index]
            else:  # not where its alias says: sort again at the next read
                self._order = None

    def get(self, device_id: str) -> Device | None:
        """The device whose id is ``device_id``."""
        return self._devices.get(device_id.lower())

    def find(self, ref: str) -> Device | None:
        """The device whose id or alias is ``ref``."""
        return self._devices.get(ref.lower()) or self._by_alias.get(ref)

    def exposed_tools(self) -> Sequence[DeviceTool]:
        """The per-device tools the model may see, devices by alias, tools in device order.

        A snapshot, made again only after a change: between changes every read is free.
        """
        return self._exposure.tools(self._devices.values())

    def lookup(self, name: str) -> DeviceTool | None:
        """The exposed tool whose MCP name is ``name``."""
        pair = self._names.lookup(name)
        device = self._devices.get(pair[0]) if pair is not None else None
        if pair is None or device is None or not device.exposed:
            return None
        decided = device.decisions.by_name.get(pair[1]) if device.decisions is not None else None
        if decided is None or decided.refusal is not None:
            return None
        return DeviceTool(device, decided)  # equal to the one listed

    def changes(self) -> Changes:
        """Subscribe, from now on, to changes of the tool list hosts see.

        Use as ``async with registry.changes() as changes: async for _ in changes: ...``; each
        item means "it changed since you last looked" (several changes fold into one).
        """
        return self._exposure.changes()

    def changed_since(self, mark: int) -> tuple[Sequence[Device] | None, int]:
        """The devices whose place in what hosts see may have changed since ``mark`` (None:
        any device, read them all), and the mark to pass next time (0 at first)."""
        return self._exposure.changed_since(mark), self._exposure.mark

    @property
    def version(self) -> int:
        """A number that grows with every change of what hosts see."""
        return self._exposure.version

    def device_changes(self) -> Changes:
        """Subscribe to changes of any device: joins, leaves, catalogues, approvals, names.

        Like ``changes()``, each item means "something changed since you last looked".
        """
        return self._device_changes.subscribe(latest_only=True)

    def holder(self, alias: str) -> Device | None:
        """The device called ``alias``, if one is."""
        return self._by_alias.get(alias)

    # --- one device's entries: the changes the services make -------------------------------

    def device(
        self, device_id: str, board: str | None, alias: str | None = None, *,
        state: str = APPROVED, client_id: str | None = None, transport: str | None = None,
    ) -> Device:  # fmt: skip
        """The device called ``device_id``, made (and named) if it is new.

        A new device's ``state``, ``client_id`` and ``transport`` are in its record before anyone
        hears of it (the record watchers: a replica announcing an unbound device as approved
        would let another replica bind it).
        """
        device = self._devices.get(device_id)
        if device is None:
            now = self.clock()
            record = DeviceRecord(device_id=device_id, alias=alias or self._alias(device_id, board),
                                  board=board, client_id=client_id, transport=transport,
                                  first_seen=now, last_seen=now, state=state)  # fmt: skip
            device = self._devices[device_id] = Device(record)
            self._by_alias.setdefault(record.alias, device)
            self._order_add(device)
            self.save(record)
        return device

    def learn_board(self, device: Device, board: str) -> bool:
        """Note the device's board if none is known; name the device after it if it had none
        (then True: the caller's log line says so, one line less a join).

        An alias is fixed once people or hosts may have seen it: from the first sight of a board
        (a stock device's OTA check-in) or the first listing. A device that connected without
        any board (a WebSocket handshake carries none) is named at its first listing, before any
        of its tools has a name.
        """
        record = device.record
        if device.named:  # by its board, the config, an enrollment or a past run
            # The OTA check-in's board (its board.type) says it better than serverInfo.
            record.board = record.board or board
            return False
        record.board = board
        self.set_alias(device, self._alias(record.device_id, board))
        return True

    def set_alias(self, device: Device, alias: str) -> None:
        """Call ``device`` ``alias`` (the one place an alias changes: its lookups follow)."""
        if self._by_alias.get(device.alias) is device:
            del self._by_alias[device.alias]
        self._order_drop(device)
        device.record.alias = alias
        self._by_alias.setdefault(alias, device)
        self._order_add(device)

    def _alias(self, device_id: str, board: str | None) -> str:
        configured = self.config.device(device_id).name
        if configured:
            return clean_alias(configured)
        alias = base = derive_alias(device_id, board)
        if self._fleet_names is not None:
            return alias  # cluster: no numbering by arrival; the fleet rule tells tools apart
        number = 1
        while (holder := self._by_alias.get(alias)) is not None and holder.device_id != device_id:
            number += 1
            alias = f"{base}_{number}"
        return alias

    def use(self, device: Device, catalogue: Catalogue | None) -> None:
        """Give ``device`` this catalogue: decide each tool once, then show it to hosts."""
        self.hide(device)
        device.catalogue = catalogue
        decided = (
            self._decide.decide(device.device_id, catalogue) if catalogue is not None else None
        )
        device.decisions, device.names = decided, self._names
        tools = decided.names if decided is not None else None  # the catalogue's, shared
        if self._fleet_names is not None:  # tools no longer listed free their names
            self._fleet_names.release(device.device_id, set(tools.names) if tools else set())
        if tools is not None:  # its plain names held through the catalogue's, not one by one
            self.store.save_names(self._names.assign_all(device.device_id, device.alias, tools))
        self.show(device)
        self.decide_displaced()

    def decide_displaced(self) -> None:
        """cluster: name again the devices whose names the fleet rule now decides otherwise."""
        for device_id in self._fleet_names.displaced() if self._fleet_names is not None else ():
            if (other := self._devices.get(device_id)) is not None:
                self.use(other, other.catalogue)

    def save(self, record: DeviceRecord) -> None:
        """Queue the record's write, and tell whoever watches devices that one changed."""
        self.store.save_device(record)
        self.changed(record)

    def subscribe_records(
        self, callback: Callable[[str, DeviceRecord | None], object]
    ) -> Unsubscribe:
        """Tell ``callback`` of each record saved (the device id and its record) or forgotten
        (the id and None): the cluster's fleet, the voice proxy's upstreams."""
        return self._records.subscribe(callback)

    def subscribe_discoveries(self, callback: Callable[[float], object]) -> Unsubscribe:
        """Tell ``callback`` how long each discovery took (seconds from connecting to a listed
        catalogue): /metrics."""
        return self._discoveries.subscribe(callback)

    def discovered(self, seconds: float) -> None:
        """A device's discovery took ``seconds``: tell the subscribers."""
        self._discoveries.notify(seconds)

    def changed(self, record: DeviceRecord) -> None:
        """Tell whoever watches devices that ``record`` changed, without writing it (yet)."""
        self._device_changes.publish(None)
        self._records.notify(record.device_id, record)

    def _shows_tools_of(self, device: Device) -> bool:
        if not device.approved:
            return False
        if device.online or self.config.offline_tools == "keep":
            return True
        # hide mode: a short drop must not make the list flap
        return self.clock() - device.record.last_seen < self.config.offline_grace

    def show(self, device: Device) -> None:
        """Bring the device's entries in line with whether hosts should see its tools."""
        if self._shows_tools_of(device):
            self._exposure.show(device)
        else:
            self._exposure.hide(device)

    def hide(self, device: Device) -> None:
        """Take the device's tools from what hosts see."""
        self._exposure.hide(device)

    def publish(self) -> None:
        """Tell whoever watches devices that something changed (a count, a status)."""
        self._device_changes.publish(None)

    def remove(self, device: Device) -> bool:
        """Take ``device`` and its names out for good (False: it was not known as itself)."""
        if self._devices.get(device.device_id) is not device:
            return False
        del self._devices[device.device_id]
        self._order_drop(device)
        self.unwait(device.device_id)
        if self._by_alias.get(device.alias) is device:
            del self._by_alias[device.alias]
        self.hide(device)
        if device.session is not None:
            device.session = None
            self.online_count -= 1
        if device.hide_timer is not None:
            device.hide_timer.cancel()
        self._names.forget(device.device_id)
        self.store.forget_device(device.device_id)
        self._device_changes.publish(None)
        self._records.notify(device.device_id, None)
        self.decide_displaced()
        return True


def _order_key(device: Device) -> tuple[str, str]:
    return (device.alias, device.device_id)
