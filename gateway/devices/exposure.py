"""What hosts see: the exposed tools of every device, kept device by device.

``Exposure`` adds a device's tools to the list hosts see, or takes them out, one device at a
time: a join costs the same in a fleet of ten or of ten thousand. Whether a device's tools
should be seen (approval, online, offline grace) is the registry's call; this keeps which devices
are shown (``Device.exposed``), the snapshot read between changes, and the subscribers told of
each change. It keeps no entry per tool: a name is looked up through the names (the registry's
``lookup``), which a fleet holds anyway.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gateway.devices.broadcast import Broadcast, Subscription
from gateway.devices.device import Device, DeviceTool

__all__ = ["Changes", "Exposure"]

Changes = Subscription[None]


class Exposure:
    """The per-device tools the model may see, by MCP name.

    ``touched`` counts the tool entries added to or taken from what hosts see: the work of the
    updates so far (tests use it to show a join's work does not grow with the fleet).
    ``version`` grows with every change of what hosts see.
    """

    def __init__(self) -> None:
        """Start with nothing shown."""
        self._snapshot: tuple[DeviceTool, ...] | None = None
        self._changes: Broadcast[None] = Broadcast()
        self.touched = 0
        self.version = 0

    def tools(self, devices: Iterable[Device]) -> Sequence[DeviceTool]:
        """The exposed tools of ``devices`` (every known one), by alias, tools in device order.

        A snapshot, made again only after a change: between changes every read is free.
        """
        if self._snapshot is None:
            shown = sorted((d for d in devices if d.exposed),
                           key=lambda d: (d.alias, d.device_id))  # fmt: skip
            self._snapshot = tuple(tool for device in shown for tool in device.shown_tools())
        return self._snapshot

    def changes(self) -> Changes:
        """Subscribe, from now on, to changes of the tool list hosts see (latest only)."""
        return self._changes.subscribe(latest_only=True)

    def show(self, device: Device) -> None:
        """Add the tools of ``device`` that the model may use, unless they are shown already."""
        if device.exposed or device.decisions is None or not device.decisions.by_name:
            return
        self.touched += device.decisions.hosts
        device.exposed = True
        self._changed()

    def hide(self, device: Device) -> None:
        """Take the tools of ``device`` out of what hosts see, if they are shown."""
        if not device.exposed:
            return
        self.touched += device.decisions.hosts if device.decisions is not None else 0
        device.exposed = False
        self._changed()

    def _changed(self) -> None:
        self.version += 1
        self._snapshot = None
        self._changes.publish(None)
