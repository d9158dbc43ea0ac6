"""Every device the gateway knows: online or not, its catalogue, and the MCP names of its tools.

The registry is the one place that decides what hosts see. It announces a change (through
``changes()``) only when the visible tool list really changes, so a device that drops and comes
back with the same tools does not make hosts refetch (and lose their prompt caches).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.config import Config
from gateway.devices.policy import refusal
from gateway.devices.store import DeviceRecord, Store
from gateway.naming import NameMap, clean_alias, derive_alias

__all__ = ["Changes", "Device", "DeviceRegistry", "DeviceSession", "ExposedTool"]

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]


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


@dataclass(slots=True)
class Device:
    """A known device; ``session`` is set while it is connected."""

    record: DeviceRecord
    session: DeviceSession | None = None

    @property
    def device_id(self) -> str:
        """The device's id (its MAC address for stock firmware)."""
        return self.record.device_id

    @property
    def alias(self) -> str:
        """The short name its tools are prefixed with."""
        return self.record.alias

    @property
    def online(self) -> bool:
        """True while the device is connected."""
        return self.session is not None

    @property
    def firmware(self) -> str | None:
        """The firmware version the device last reported (OTA check-in or ``serverInfo``)."""
        version = (self.record.server_info or {}).get("version")
        return version if isinstance(version, str) else None

    def tool(self, name: str) -> JsonObject | None:
        """The device tool called ``name`` (its own name, e.g. ``self.lamp.turn_on``)."""
        return next((t for t in self.record.tools if t["name"] == name), None)


@dataclass(frozen=True, slots=True)
class ExposedTool:
    """A device tool as hosts see it: its MCP ``name`` and the device tool behind it."""

    name: str
    device: Device
    tool: JsonObject


class DeviceRegistry:
    """Devices, catalogues and names, persisted in the data dir's SQLite store."""

    def __init__(self, config: Config, store: Store, clock: Callable[[], float] = time.time):
        self._config = config
        self._store = store
        self._clock = clock
        self._devices: dict[str, Device] = {r.device_id: Device(r) for r in store.devices()}
        self._names = NameMap(store.names())
        self._subscribers: list[asyncio.Queue[None]] = []
        self._exposed: dict[str, ExposedTool] = {}
        self._visible = ""
        for device in self._devices.values():
            configured = config.device(device.device_id).name
            if configured:  # the config may have renamed the device since the last run
                device.record.alias = clean_alias(configured)
            self._assign_names(device)
        self._refresh()

    # --- queries ---------------------------------------------------------------------------

    def devices(self) -> list[Device]:
        """Every known device, ordered by alias (a stable order keeps hosts' caches warm)."""
        return sorted(self._devices.values(), key=lambda d: (d.alias, d.device_id))

    def find(self, ref: str) -> Device | None:
        """The device whose id or alias is ``ref``."""
        device = self._devices.get(ref.lower())
        if device is not None:
            return device
        return next((d for d in self._devices.values() if d.alias == ref), None)

    def exposed_tools(self) -> list[ExposedTool]:
        """The per-device tools the model may see, devices by alias, tools in device order."""
        return list(self._exposed.values())

    def lookup(self, name: str) -> ExposedTool | None:
        """The exposed tool whose MCP name is ``name``."""
        return self._exposed.get(name)

    def _shows_tools_of(self, device: Device) -> bool:
        if device.online or self._config.offline_tools == "keep":
            return True
        # hide mode: a short drop must not make the list flap
        return self._clock() - device.record.last_seen < self._config.offline_grace

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
        device_id = device_id.lower()
        now = self._clock()
        device = self._devices.get(device_id)
        if device is None:
            record = DeviceRecord(device_id, self._alias(device_id, None), None, client_id,
                                  transport, None, (), now, now)  # fmt: skip
            device = self._devices[device_id] = Device(record)
        replaced, device.session = device.session, session
        device.record.client_id = client_id or device.record.client_id
        device.record.transport = transport or device.record.transport
        device.record.last_seen = now
        self._store.save_device(device.record)
        logger.info("device %s (%s) online over %s", device.alias, device_id, transport)
        self._refresh()
        return replaced

    def disconnect(self, device_id: str, session: DeviceSession) -> None:
        """Mark ``device_id`` offline, unless a newer session has replaced ``session``."""
        device = self._devices.get(device_id.lower())
        if device is None or device.session is not session:
            return
        device.session = None
        device.record.last_seen = self._clock()
        self._store.touch(device.device_id, device.record.last_seen)
        logger.info("device %s (%s) offline", device.alias, device.device_id)
        self._refresh()
        if self._config.offline_tools == "hide":
            asyncio.get_running_loop().call_later(self._config.offline_grace, self._refresh)

    def adopt(self, device_id: str, name: str) -> None:
        """Name a device that was enrolled as ``name`` (unless the config or a past run did)."""
        device_id = device_id.lower()
        if device_id in self._devices or self._config.device(device_id).name:
            return
        now = self._clock()
        alias = clean_alias(name)
        if any(d.alias == alias for d in self._devices.values()):
            alias = self._alias(device_id, name)
        record = DeviceRecord(device_id, alias, None, None, None, None, (), now, now)
        self._devices[device_id] = Device(record)
        self._store.save_device(record)

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

        It stays offline until it connects. Its board names it until it lists tools, and its
        firmware version is kept as ``serverInfo.version`` (what stock firmware reports there).
        """
        device_id = device_id.lower()
        now = self._clock()
        device = self._devices.get(device_id)
        if device is None:
            record = DeviceRecord(device_id, self._alias(device_id, board), board, client_id,
                                  transport, None, (), now, now)  # fmt: skip
            device = self._devices[device_id] = Device(record)
        record = device.record
        if board and board != record.board and not record.tools and self._derived_alias(record):
            record.alias = self._alias(device_id, board)
        record.board = board or record.board
        record.client_id = client_id or record.client_id
        record.transport = transport or record.transport
        if firmware:
            record.server_info = {"name": record.board, **(record.server_info or {})}
            record.server_info["version"] = firmware
        record.last_seen = now
        self._store.save_device(record)
        logger.info("device %s (%s) checked in: %s %s", record.alias, device_id, board, firmware)
        self._refresh()
        return device

    def set_catalogue(
        self, device_id: str, tools: tuple[JsonObject, ...], server_info: JsonObject | None
    ) -> None:
        """Store the device's freshly listed tools and tell hosts if what they see changed."""
        device = self._devices[device_id.lower()]
        record = device.record
        board = server_info.get("name") if server_info else None
        if isinstance(board, str) and board and record.board != board:
            if not record.tools and self._derived_alias(record):
                # first listing: the board name gives a better alias than a guess
                record.alias = self._alias(record.device_id, board)
            record.board = board
        record.server_info = server_info
        record.tools = tools
        record.last_seen = self._clock()
        self._store.save_device(record)
        self._assign_names(device)
        logger.info("device %s lists %d tools", record.alias, len(tools))
        self._refresh()

    def _derived_alias(self, record: DeviceRecord) -> bool:
        """True when nobody named the device: its alias was made from its board and id."""
        return record.alias.startswith(derive_alias(record.device_id, record.board))

    def _alias(self, device_id: str, board: str | None) -> str:
        configured = self._config.device(device_id).name
        if configured:
            return clean_alias(configured)
        alias = derive_alias(device_id, board)
        taken = {d.alias for d in self._devices.values() if d.device_id != device_id}
        return alias if alias not in taken else f"{alias}_{len(taken)}"

    # --- change announcements --------------------------------------------------------------

    def _assign_names(self, device: Device) -> None:
        assigned = [
            self._names.assign(device.device_id, device.alias, tool["name"])
            for tool in device.record.tools
        ]
        self._store.save_names([entry for entry, is_new in assigned if is_new])

    def _refresh(self) -> None:
        """Recompute what hosts see; announce it if it changed."""
        exposed: dict[str, ExposedTool] = {}
        for device in self.devices():
            if not self._shows_tools_of(device):
                continue
            options = self._config.device(device.device_id)
            for tool in device.record.tools:
                if refusal(tool, options) is None:
                    entry, _ = self._names.assign(device.device_id, device.alias, tool["name"])
                    exposed[entry.name] = ExposedTool(entry.name, device, tool)
        self._exposed = exposed
        visible = json.dumps([(n, t.tool) for n, t in exposed.items()], sort_keys=True)
        if visible == self._visible:
            return
        self._visible = visible
        for queue in self._subscribers:
            if queue.empty():  # coalesce: one pending "changed" says it all
                queue.put_nowait(None)

    def changes(self) -> Changes:
        """Subscribe, from now on, to changes of the tool list hosts see.

        Use as ``async with registry.changes() as changes: async for _ in changes: ...``; each
        item means "it changed since you last looked" (several changes may fold into one).
        """
        return Changes(self._subscribers)


class Changes:
    """A subscription to registry changes: an async context manager and iterator."""

    def __init__(self, subscribers: list[asyncio.Queue[None]]) -> None:
        self._subscribers = subscribers
        self._queue: asyncio.Queue[None] = asyncio.Queue(maxsize=1)
        subscribers.append(self._queue)

    async def __aenter__(self) -> Changes:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop receiving changes."""
        if self._queue in self._subscribers:
            self._subscribers.remove(self._queue)

    def __aiter__(self) -> Changes:
        return self

    async def __anext__(self) -> None:
        await self._queue.get()
