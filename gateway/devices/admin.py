"""The user's decisions about devices: admission, approval, identity binding, names, forgetting.

``DeviceAdmin`` adds to the known devices what an operator (CLI, dashboard) or a device's first
contact decides: whether a device may connect (``admit``: pending, approved or rejected, and the
Client-Id it is bound to), the pairing window, renaming, naming an enrolled device, and forgetting.
Each change is saved through the store and told to whoever watches devices.
"""

from __future__ import annotations

import logging

from gateway.devices.device import APPROVED, PENDING, REJECTED, Device
from gateway.devices.known import KnownDevices
from gateway.devices.naming import clean_alias
from gateway.devices.store import DeviceRecord

__all__ = ["DeviceAdmin"]

logger = logging.getLogger(__name__)


class DeviceAdmin(KnownDevices):
    """The known devices, with the changes that people and first contacts decide."""

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
        for watcher in self.record_watchers:
            watcher(device.device_id, None)
        logger.info("device %s (%s) forgotten", device.alias, device.device_id)
        self._decide_displaced()

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

    def learn(self, record: DeviceRecord) -> Device:
        """cluster: take the fleet's decisions on a device (state, alias, binding, board).

        What another replica decided arrives here from the broker; the device is made if it
        is new. Its tools are decided again when its alias changed, and shown or hidden by
        its state.
        """
        device = self._device(record.device_id, record.board, record.alias)
        mine = device.record
        mine.board = record.board or mine.board
        mine.transport = record.transport or mine.transport
        mine.state, mine.binding = record.state, record.binding
        if record.alias != mine.alias and not self._config.device(record.device_id).name:
            if self._by_alias.get(mine.alias) is device:
                del self._by_alias[mine.alias]
            mine.alias = record.alias
            self._by_alias.setdefault(record.alias, device)
            self._use(device, device.catalogue)
        self._save(mine)
        self._show(device)
        return device

    def adopt(self, device_id: str, name: str) -> None:
        """Name a device that was enrolled as ``name`` (unless the config or a past run did)."""
        device_id = device_id.lower()
        if device_id in self._devices or self._config.device(device_id).name:
            return
        alias = clean_alias(name)
        self._device(device_id, None, alias if alias not in self._by_alias else None)
