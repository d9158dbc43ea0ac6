"""Every device the gateway knows: online or not, its catalogue, and the MCP names of its tools.

The registry is the one place that decides what hosts see, and it decides it device by device:
a device joining, leaving or listing new tools updates only its own entries, so a join costs
the same in a fleet of ten or of ten thousand. Each tool is decided once, when its catalogue
arrives (``DeviceTool``: MCP name and policy verdicts), and identical catalogues are shared
(``Catalogues``). Hosts are told of a change (``changes()``) only when what they see really
changed, so a device that drops and comes back with the same tools does not make them refetch
(and lose their prompt caches).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.config import Config
from gateway.devices.broadcast import Broadcast, Subscription
from gateway.devices.catalogue import Catalogue, Catalogues, Rejection, ToolSpec
from gateway.devices.naming import NameMap, clean_alias, derive_alias
from gateway.devices.policy import Hints, refusal, tool_hints
from gateway.devices.store import DeviceRecord, Store

__all__ = [
    "APPROVED",
    "PENDING",
    "REJECTED",
    "Changes",
    "Device",
    "DeviceRegistry",
    "DeviceSession",
    "DeviceTool",
]

APPROVED, PENDING, REJECTED = "approved", "pending", "rejected"

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]
Changes = Subscription[None]


class DeviceSession(Protocol):
    """A live connection to a device, as the registry uses it."""

    async def call(self, tool: str, arguments: JsonObject) -> JsonObject:
        """Call ``tool`` on the device and return its ``tools/call`` result.

        The caller bounds the wait; a cancelled call must be forgotten by the session.
        """
        ...

    async def aclose(self) -> None:
        """Close the connection."""
        ...


@dataclass(eq=False, slots=True)
class Device:
    """A known device; ``session`` is set while it is connected."""

    record: DeviceRecord
    catalogue: Catalogue | None = None
    tools: dict[str, DeviceTool] = field(default_factory=dict)  # by the device's tool name
    session: DeviceSession | None = None
    exposed: bool = False  # its tools are in the list hosts see
    hide_timer: asyncio.TimerHandle | None = None
    conflict: str | None = None  # the last attempt to claim its id with another identity
    connected_at: float | None = None  # monotonic time of a connection still discovering tools

    @property
    def device_id(self) -> str:
        """The device's id (its MAC address for stock firmware)."""
        return self.record.device_id

    @property
    def alias(self) -> str:
        """The short name its tools are prefixed with."""
        return self.record.alias

    @property
    def named(self) -> bool:
        """False until its name is settled: a device that connected without a board (a
        WebSocket handshake carries none) is named after the board of its first listing."""
        record = self.record
        return (record.board is not None or record.catalogue is not None
                or record.alias != derive_alias(record.device_id, None))  # fmt: skip

    @property
    def label(self) -> str:
        """How logs name the device: ``alias (id)``, or its id alone until it is named, so a
        log never shows one device under two names."""
        return f"{self.alias} ({self.device_id})" if self.named else self.device_id

    @property
    def online(self) -> bool:
        """True while the device is connected."""
        return self.session is not None

    @property
    def approved(self) -> bool:
        """True once the device may serve tools (a device token, or the user approved it)."""
        return self.record.state == APPROVED

    @property
    def firmware(self) -> str | None:
        """The firmware version the device last reported (OTA check-in or ``serverInfo``)."""
        version = (self.record.server_info or {}).get("version")
        return version if isinstance(version, str) else None

    @property
    def rejected(self) -> tuple[Rejection, ...]:
        """The tools of its catalogue that were not served, and why."""
        return self.catalogue.rejected if self.catalogue is not None else ()

    def tool(self, name: str) -> DeviceTool | None:
        """The tool called ``name`` (its own name, e.g. ``self.lamp.turn_on``)."""
        return self.tools.get(name)


@dataclass(frozen=True, slots=True, eq=False)
class DeviceTool:
    """One tool of one device, decided when its catalogue arrived."""

    device: Device
    spec: ToolSpec
    name: str  # its MCP name
    refusal: str | None  # why the model may not use it; None when it may
    user_refusal: str | None  # why even the person at the CLI or dashboard may not
    hints: Hints  # what hosts are told: read-only, destructive

    def refused(self, *, user: bool) -> str | None:
        """Why this caller may not use the tool, or None."""
        if not self.device.approved:
            alias = self.device.alias
            if self.device.record.state == REJECTED:
                return f"device {alias} was rejected"
            return (
                f"device {alias} is waiting for approval (esp-mcp-gateway devices approve {alias})"
            )
        return self.user_refusal if user else self.refusal


class DeviceRegistry:
    """Devices, catalogues and names, persisted in the data dir's SQLite store.

    ``touched`` counts the tool entries added to or taken from what hosts see: the work of the
    updates so far (tests use it to show a join's work does not grow with the fleet).
    """

    def __init__(self, config: Config, store: Store, clock: Callable[[], float] = time.time):
        self._config = config
        self._store = store
        self._clock = clock
        self._catalogues = Catalogues()
        self._changes: Broadcast[None] = Broadcast()
        self._device_changes: Broadcast[None] = Broadcast()
        self._devices: dict[str, Device] = {}
        self._by_alias: dict[str, Device] = {}
        self._exposed: dict[str, DeviceTool] = {}
        self._snapshot: tuple[DeviceTool, ...] | None = None
        self.online_count = 0
        self.touched = 0
        self.version = 0  # grows with every change of what hosts see
        self.pairing_until = 0.0  # until then (clock time), new devices are approved as they come
        # Told how long each discovery took (seconds from connecting to a listed catalogue).
        self.discovery_watchers: list[Callable[[float], None]] = []
        stored = store.load()
        self._names = NameMap(stored.names)
        catalogues = self._catalogues.load(stored.catalogues)
        for record in stored.devices:
            configured = config.device(record.device_id).name
            if configured and clean_alias(configured) != record.alias:
                record.alias = clean_alias(configured)  # the config renamed it since the last run
                store.save_device(record)
            device = self._devices[record.device_id] = Device(record)
            self._by_alias.setdefault(record.alias, device)
            if record.catalogue is not None and record.catalogue not in catalogues:
                record.catalogue = None  # unreadable: the device lists its tools again anyway
                store.save_device(record)
            if record.catalogue is not None:
                self._use(device, catalogues[record.catalogue])

    # --- queries ---------------------------------------------------------------------------

    def devices(self) -> list[Device]:
        """Every known device, ordered by alias (a stable order keeps hosts' caches warm)."""
        return sorted(self._devices.values(), key=lambda d: (d.alias, d.device_id))

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
        if self._snapshot is None:
            shown = sorted((d for d in self._devices.values() if d.exposed),
                           key=lambda d: (d.alias, d.device_id))  # fmt: skip
            self._snapshot = tuple(
                tool for device in shown for tool in device.tools.values() if tool.refusal is None
            )
        return self._snapshot

    def lookup(self, name: str) -> DeviceTool | None:
        """The exposed tool whose MCP name is ``name``."""
        return self._exposed.get(name)

    def changes(self) -> Changes:
        """Subscribe, from now on, to changes of the tool list hosts see.

        Use as ``async with registry.changes() as changes: async for _ in changes: ...``; each
        item means "it changed since you last looked" (several changes fold into one).
        """
        return self._changes.subscribe(latest_only=True)

    def device_changes(self) -> Changes:
        """Subscribe to changes of any device: joins, leaves, catalogues, approvals, names.

        Like ``changes()``, each item means "something changed since you last looked".
        """
        return self._device_changes.subscribe(latest_only=True)

    # --- updates from connections ----------------------------------------------------------

    def connect(
        self,
        device_id: str,
        session: DeviceSession,
        *,
        client_id: str | None = None,
        transport: str | None = None,
    ) -> DeviceSession | None:
        """Mark ``device_id`` online through ``session``; return the session it replaces."""
        device = self._device(device_id.lower(), None)
        replaced, device.session = device.session, session
        if replaced is None:
            self.online_count += 1
        record = device.record
        record.client_id = client_id or record.client_id
        record.transport = transport or record.transport
        record.last_seen = self._clock()
        device.connected_at = time.monotonic()
        self._save(record)
        if device.hide_timer is not None:
            device.hide_timer.cancel()
            device.hide_timer = None
        logger.info("device %s online over %s", device.label, transport)
        self._show(device)
        return replaced

    def disconnect(self, device_id: str, session: DeviceSession) -> None:
        """Mark ``device_id`` offline, unless a newer session has replaced ``session``."""
        device = self._devices.get(device_id.lower())
        if device is None or device.session is not session:
            return
        device.session = None
        self.online_count -= 1
        device.record.last_seen = self._clock()
        self._save(device.record)
        logger.info("device %s offline", device.label)
        if self._config.offline_tools == "hide":
            grace = self._config.offline_grace
            loop = asyncio.get_running_loop()
            device.hide_timer = loop.call_later(grace, self._show, device)

    def admit(
        self,
        device_id: str,
        *,
        trusted: bool,
        client_id: str | None,
        transport: str,
        check_binding: bool = True,
        board: str | None = None,
    ) -> str | None:
        """Decide whether ``device_id`` may check in or connect; None, or why it may not.

        ``trusted`` is True when it presented a device token (shared or its own): it is approved
        if it was new or pending. A device without one (a stock device through OTA) is *pending*
        until the user approves it, unless ``[devices] adoption = "auto"`` or a pairing window
        is open. Once approved, a device is bound to the Client-Id it presented: a later attempt
        with another one is refused and kept as the device's ``conflict``, never swapped in.
        """
        device_id = device_id.lower()
        device = self._devices.get(device_id)
        if device is None:
            device = self._device(device_id, board)
            device.record.client_id = client_id
            device.record.state = PENDING
            if trusted or self._config.adoption == "auto" or self._clock() < self.pairing_until:
                self.approve(device)
            else:
                logger.warning("device %s is waiting for approval: esp-mcp-gateway devices "
                               "approve %s", device.label,
                               device.alias if device.named else device_id)  # fmt: skip
            return None
        record = device.record
        if record.state == REJECTED:
            return f"device {device_id} was rejected"
        if check_binding and record.binding is not None and client_id != record.binding:
            device.conflict = (f"{transport} attempt with Client-Id {client_id!r} refused: "
                               f"the device is bound to another")  # fmt: skip
            logger.warning("refused %s for %s (%s): Client-Id %r, bound to another",
                           transport, device.alias, device_id, client_id)  # fmt: skip
            return f"device {device_id} is bound to another Client-Id"
        if record.state == PENDING and (trusted or self._clock() < self.pairing_until):
            self.approve(device)
        return None

    def approve(self, device: Device) -> None:
        """Let ``device`` serve tools; bind its id to the Client-Id it presented."""
        record = device.record
        record.state = APPROVED
        record.binding = record.binding or record.client_id
        self._save(record)
        logger.info("device %s approved", device.label)
        self._show(device)

    def reject(self, device: Device) -> None:
        """Refuse ``device`` from now on; its tools go (the caller closes its session)."""
        device.record.state = REJECTED
        self._save(device.record)
        logger.info("device %s (%s) rejected", device.alias, device.device_id)
        self._hide(device)

    def pair(self, seconds: float) -> float:
        """Approve new devices as they arrive for ``seconds``; return when that ends."""
        self.pairing_until = self._clock() + seconds
        logger.info("pairing for %g s: new devices are approved as they arrive", seconds)
        return self.pairing_until

    def forget(self, device: Device) -> None:
        """Remove ``device`` and its names for good; if it comes back, it is a new device.

        A connected device stays connected until its session is closed (the caller's business);
        its session no longer counts for anything.
        """
        if self._devices.get(device.device_id) is not device:
            return
        del self._devices[device.device_id]
        if self._by_alias.get(device.alias) is device:
            del self._by_alias[device.alias]
        self._hide(device)
        if device.session is not None:
            device.session = None
            self.online_count -= 1
        if device.hide_timer is not None:
            device.hide_timer.cancel()
        self._names.forget(device.device_id)
        self._store.forget_device(device.device_id)
        self._device_changes.publish(None)
        logger.info("device %s (%s) forgotten", device.alias, device.device_id)

    def rename(self, device: Device, name: str) -> str:
        """Give ``device`` a new alias, and its tools new MCP names; return the alias.

        Hosts are told the tool list changed. A device named in the config keeps that name.

        Raises:
            ValueError: the config names the device, or another device has the alias.
        """
        if self._config.device(device.device_id).name:
            raise ValueError(f"the config names device {device.alias}: rename it there")
        alias = clean_alias(name)
        holder = self._by_alias.get(alias)
        if holder is not None and holder is not device:
            raise ValueError(f"another device ({holder.device_id}) is called {alias}")
        if alias == device.alias:
            return alias
        if self._by_alias.get(device.alias) is device:
            del self._by_alias[device.alias]
        logger.info("device %s (%s) renamed %s", device.alias, device.device_id, alias)
        device.record.alias = alias
        self._by_alias[alias] = device
        self._save(device.record)
        self._use(device, device.catalogue)  # new names, saved; hosts told if they see them
        return alias

    def adopt(self, device_id: str, name: str) -> None:
        """Name a device that was enrolled as ``name`` (unless the config or a past run did)."""
        device_id = device_id.lower()
        if device_id in self._devices or self._config.device(device_id).name:
            return
        alias = clean_alias(name)
        self._device(device_id, None, alias if alias not in self._by_alias else None)

    def register(
        self,
        device_id: str,
        *,
        board: str | None = None,
        firmware: str | None = None,
        client_id: str | None = None,
        transport: str | None = None,
    ) -> Device:
        """Record a device that checked in without connecting (a stock device's boot-time OTA).

        It stays offline until it connects. A new device is named after its board; its firmware
        version is kept as ``serverInfo.version`` (what stock firmware reports there).
        """
        device = self._device(device_id.lower(), board)
        record = device.record
        record.board = board or record.board
        record.client_id = client_id or record.client_id
        record.transport = transport or record.transport
        if firmware:
            record.server_info = {"name": record.board, **(record.server_info or {})}
            record.server_info["version"] = firmware
        record.last_seen = self._clock()
        self._save(record)
        logger.info("device %s (%s) checked in: %s %s", record.alias, device_id, board, firmware)
        return device

    def set_catalogue(
        self, device_id: str, entries: Sequence[object], server_info: JsonObject | None
    ) -> None:
        """Take the device's freshly listed tool entries; tell hosts if what they see changed."""
        device = self._devices[device_id.lower()]
        record = device.record
        if device.connected_at is not None:
            seconds, device.connected_at = time.monotonic() - device.connected_at, None
            for watcher in self.discovery_watchers:
                watcher(seconds)
        catalogue, judged = self._catalogues.get(entries)
        if judged:  # each bad tool is logged once, however many devices share the catalogue
            self._store.save_catalogue(catalogue.digest, catalogue.to_json())
            for rejection in catalogue.rejected:
                logger.warning("device %s: tool %r rejected: %s",
                               record.alias, rejection.tool, rejection.reason)  # fmt: skip
        board = server_info.get("name") if server_info else None
        if isinstance(board, str) and board:
            self._learn_board(device, board)
        record.server_info = server_info
        record.last_seen = self._clock()
        self._save(record)
        logger.info("device %s lists %d tools", device.label, len(catalogue.tools))
        if catalogue is not device.catalogue:
            record.catalogue = catalogue.digest
            self._use(device, catalogue)

    # --- one device's entries --------------------------------------------------------------

    def _device(self, device_id: str, board: str | None, alias: str | None = None) -> Device:
        """The device called ``device_id``, made (and named) if it is new."""
        device = self._devices.get(device_id)
        if device is None:
            now = self._clock()
            record = DeviceRecord(device_id=device_id, alias=alias or self._alias(device_id, board),
                                  board=board, first_seen=now, last_seen=now)  # fmt: skip
            device = self._devices[device_id] = Device(record)
            self._by_alias.setdefault(record.alias, device)
            self._save(record)
        return device

    def _learn_board(self, device: Device, board: str) -> None:
        """Note the device's board if none is known; name the device after it if it had none.

        An alias is fixed once people or hosts may have seen it: from the first sight of a board
        (a stock device's OTA check-in) or the first listing. A device that connected without
        any board (a WebSocket handshake carries none) is named at its first listing, before any
        of its tools has a name.
        """
        record = device.record
        if device.named:  # by its board, the config, an enrollment or a past run
            # The OTA check-in's board (its board.type) says it better than serverInfo.
            record.board = record.board or board
            return
        record.board = board
        alias = self._alias(record.device_id, board)
        logger.info("device %s is named %s, after its board", record.device_id, alias)
        if self._by_alias.get(record.alias) is device:
            del self._by_alias[record.alias]
        record.alias = alias
        self._by_alias.setdefault(alias, device)

    def _alias(self, device_id: str, board: str | None) -> str:
        configured = self._config.device(device_id).name
        if configured:
            return clean_alias(configured)
        alias = base = derive_alias(device_id, board)
        number = 1
        while (holder := self._by_alias.get(alias)) is not None and holder.device_id != device_id:
            number += 1
            alias = f"{base}_{number}"
        return alias

    def _use(self, device: Device, catalogue: Catalogue | None) -> None:
        """Give ``device`` this catalogue: decide each tool once, then show it to hosts."""
        options = self._config.device(device.device_id)
        self._hide(device)
        device.catalogue = catalogue
        device.tools = {}
        new_names = []
        for spec in catalogue.tools if catalogue is not None else ():
            entry, is_new = self._names.assign(device.device_id, device.alias, spec.name)
            if is_new:
                new_names.append(entry)
            device.tools[spec.name] = DeviceTool(
                device=device,
                spec=spec,
                name=entry.name,
                refusal=refusal(spec.name, spec.user_only, options),
                user_refusal=refusal(spec.name, spec.user_only, options, user=True),
                hints=tool_hints(
                    spec.name, options, read_only=spec.read_only, destructive=spec.destructive
                ),
            )
        self._store.save_names(new_names)
        self._show(device)

    def _save(self, record: DeviceRecord) -> None:
        """Queue the record's write, and tell whoever watches devices that one changed."""
        self._store.save_device(record)
        self._device_changes.publish(None)

    def _shows_tools_of(self, device: Device) -> bool:
        if not device.approved:
            return False
        if device.online or self._config.offline_tools == "keep":
            return True
        # hide mode: a short drop must not make the list flap
        return self._clock() - device.record.last_seen < self._config.offline_grace

    def _show(self, device: Device) -> None:
        """Bring the device's entries in line with whether hosts should see its tools."""
        if not self._shows_tools_of(device):
            self._hide(device)
            return
        if device.exposed or not device.tools:
            return
        for tool in device.tools.values():
            if tool.refusal is None:
                self._exposed[tool.name] = tool
                self.touched += 1
        device.exposed = True
        self._changed()

    def _hide(self, device: Device) -> None:
        if not device.exposed:
            return
        for tool in device.tools.values():
            if self._exposed.get(tool.name) is tool:
                del self._exposed[tool.name]
                self.touched += 1
        device.exposed = False
        self._changed()

    def _changed(self) -> None:
        self.version += 1
        self._snapshot = None
        self._changes.publish(None)
