"""Every device the gateway knows: online or not, its catalogue, and the MCP names of its tools.

The registry is the one place that decides what hosts see, and it decides it device by device:
a device joining, leaving or listing new tools updates only its own entries, so a join costs
the same in a fleet of ten or of ten thousand. Each tool is decided once, when its catalogue
arrives (``DeviceTool``: MCP name and policy verdicts), and identical catalogues are shared
(``Catalogues``). Hosts are told of a change (``changes()``) only when what they see really
changed, so a device that drops and comes back with the same tools does not make them refetch
(and lose their prompt caches).

The registry is three roles, each its own object, composed at construction: the state
(``known.KnownDevices``: the devices, their records, who is connected, what hosts see), the user's
decisions on it (``admin.DeviceAdmin``), and here the connections' updates. ``DeviceRegistry`` is
also a thin facade over the other two for the callers that do a little of everything (a device
session admits, connects, lists and is looked up; so do the tests that stand in for one);
callers that need one role are handed that role (``known``, ``admin``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from gateway.devices.admin import DeviceAdmin
from gateway.devices.audit import Actor, AuditLog
from gateway.devices.device import (
    APPROVED,
    PENDING,
    REJECTED,
    Device,
    DeviceSession,
    DeviceTool,
    UpstreamStatus,
)
from gateway.devices.exposure import Changes
from gateway.devices.known import DeviceView, KnownDevices
from gateway.devices.logins import REPLACED
from gateway.devices.pages import KnownPages
from gateway.devices.store import DeviceRecord
from gateway.devices.subscribers import Unsubscribe

# The device model and the change feed are re-exported: callers know the registry, not its parts.
__all__ = [
    "APPROVED",
    "PENDING",
    "REJECTED",
    "Changes",
    "Device",
    "DeviceAdmin",
    "DeviceRegistry",
    "DeviceView",
    "KnownDevices",
    "DeviceSession",
    "DeviceTool",
    "UpstreamStatus",
]

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]


class DeviceRegistry:
    """The connections' updates on the known devices, and a facade over the devices' roles.

    ``known`` is the state and its queries, ``admin`` the user's decisions (approve, reject,
    rename, forget, ...); both are handed in, so that whoever builds the gateway can hand each
    role on by itself.
    """

    def __init__(self, known: KnownDevices, admin: DeviceAdmin) -> None:
        self.known, self.admin = known, admin
        self._config, self._store, self._clock = known.config, known.store, known.clock

    # --- the known devices (queries, watchers) --------------------------------------------

    def devices(self) -> Sequence[Device]:
        return self.known.devices()

    def devices_after(self, key: tuple[str, str] | None) -> Iterator[Device]:
        return self.known.devices_after(key)

    def get(self, device_id: str) -> Device | None:
        return self.known.get(device_id)

    def find(self, ref: str) -> Device | None:
        return self.known.find(ref)

    def exposed_tools(self) -> Sequence[DeviceTool]:
        return self.known.exposed_tools()

    def lookup(self, name: str) -> DeviceTool | None:
        return self.known.lookup(name)

    def changes(self) -> Changes:
        return self.known.changes()

    def changed_since(self, mark: int) -> tuple[Sequence[Device] | None, int]:
        return self.known.changed_since(mark)

    def device_changes(self) -> Changes:
        return self.known.device_changes()

    @property
    def version(self) -> int:
        return self.known.version

    @property
    def online_count(self) -> int:
        return self.known.online_count

    @property
    def waiting(self) -> dict[str, Device]:
        return self.known.waiting

    @property
    def waiting_boards(self) -> dict[str, Device]:
        return self.known.waiting_boards

    @property
    def pages(self) -> KnownPages:
        return self.known.pages

    @property
    def audit(self) -> AuditLog:
        return self.known.audit

    def subscribe_records(
        self, callback: Callable[[str, DeviceRecord | None], object]
    ) -> Unsubscribe:
        return self.known.subscribe_records(callback)

    @property
    def binding_key(self) -> bytes | None:
        return self.known.binding_key

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
        device = self.known.device(device_id.lower(), None)
        replaced, device.session = device.session, session
        if replaced is None:
            self.known.online_count += 1
        else:  # the same identity again (admission refused any other): a reboot, a lost link
            why = "a new login replaced the open session"
            self.admin.logins.note(REPLACED, Actor(transport or "?"), device_id=device.device_id,
                             alias=device.alias, reason=why)  # fmt: skip
        record = device.record
        seen_as = (client_id or record.client_id, transport or record.transport)
        moved = seen_as != (record.client_id, record.transport)
        record.client_id, record.transport = seen_as
        record.last_seen = self._clock()
        device.connected_at = time.monotonic()
        # Only a new Client-Id or transport is written for the connect itself: its time goes
        # with the device's next write, its listing moments later or its disconnect. (A storm
        # of joins wrote every device row once more, in another transaction.)
        if moved:
            self.known.save(record)
        else:
            self.known.changed(record)
        if device.hide_timer is not None:
            device.hide_timer.cancel()
            device.hide_timer = None
        logger.info("device %s online over %s", device.label, transport)
        self.known.show(device)
        return replaced

    def disconnect(self, device_id: str, session: DeviceSession) -> None:
        """Mark ``device_id`` offline, unless a newer session has replaced ``session``."""
        device = self.known.get(device_id)
        if device is None or device.session is not session:
            return
        device.session = None
        self.known.online_count -= 1
        device.record.last_seen = self._clock()
        self.known.save(device.record)
        logger.info("device %s offline", device.label)
        self.known.show(device)  # hosts see no change yet; the listing notes it left (offline_age)
        if self._config.offline_tools == "hide":
            grace = self._config.offline_grace
            loop = asyncio.get_running_loop()
            device.hide_timer = loop.call_later(grace, self.known.show, device)

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
        device = self.known.device(device_id.lower(), board)
        record = device.record
        record.board = board or record.board
        record.client_id = client_id or record.client_id
        record.transport = transport or record.transport
        if firmware:
            record.server_info = {"name": record.board, **(record.server_info or {})}
            record.server_info["version"] = firmware
        record.last_seen = self._clock()
        self.known.save(record)
        logger.info("device %s (%s) checked in: %s %s", record.alias, device_id, board, firmware)
        return device

    def set_upstream(self, device_id: str, server: str, state: str) -> None:
        """Note how a proxied device's voice server stands (shown by list_devices, dashboard)."""
        device = self.known.get(device_id)
        status = UpstreamStatus(server, state)
        if device is not None and device.upstream != status:
            device.upstream = status
            self.known.publish()

    def set_catalogue(
        self,
        device_id: str,
        entries: Sequence[object],
        server_info: JsonObject | None,
        digest: str | None = None,
        *,
        complete: bool = True,
    ) -> bool:
        """Take the device's freshly listed tool entries; tell hosts if what they see changed.

        ``digest``, if given, names the entries' content (equal digests, equal entries). A
        listing that stopped early (``complete`` False) replaces no known catalogue that has
        tools: a page lost, or a device deaf for a moment, is not a device with fewer tools.
        Returns whether the entries were taken.
        """
        device = self.known.get(device_id)
        if device is None:
            raise KeyError(device_id)
        record = device.record
        if device.connected_at is not None:
            seconds, device.connected_at = time.monotonic() - device.connected_at, None
            self.known.discovered(seconds)
        known = device.catalogue
        taken = complete or known is None or not known.tools
        if known is None or taken:
            catalogue, judged = self.known.catalogues.get(entries, digest)
        else:
            catalogue, judged = known, False
        if judged:  # each bad tool is logged once, however many devices share the catalogue
            self._store.save_catalogue(catalogue.digest, catalogue.to_json())
            for rejection in catalogue.rejected:
                logger.warning("device %s: tool %r rejected: %s",
                               record.alias, rejection.tool, rejection.reason)  # fmt: skip
        board = server_info.get("name") if server_info else None
        named = isinstance(board, str) and board and self.known.learn_board(device, board)
        record.server_info = server_info
        record.last_seen = self._clock()
        if catalogue is not device.catalogue:
            if record.catalogue is not None:  # its row goes once no device refers to it
                self._store.release_catalogue(record.catalogue)
            record.catalogue = catalogue.digest
            self.known.use(device, catalogue)
        logger.info("device %s lists %s%s", device.label, device.tool_counts,
                    ", named after its board" if named else "")  # fmt: skip
        self.known.save(record)  # after use: its watchers see the catalogue in use (cluster)
        return taken
