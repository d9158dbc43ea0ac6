"""What hosts see: the exposed tools of every device, kept device by device.

``Exposure`` adds a device's tools to the list hosts see, or takes them out, one device at a
time: a join costs the same in a fleet of ten or of ten thousand. Whether a device's tools
should be seen (approval, online, offline grace) is the registry's call; this keeps which devices
are shown (``Device.exposed``), the snapshot read between changes, and the subscribers told of
each change. It keeps no entry per tool: a name is looked up through the names (the registry's
``lookup``), which a fleet holds anyway.

It also keeps a journal of the devices it was asked about (``changed_since``), so that what is
made from the list (the host listing, tool_listing.py) is brought up to date device by device
rather than made again from the whole fleet.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gateway.devices.broadcast import Broadcast, Subscription
from gateway.devices.device import Device, DeviceTool

__all__ = ["Changes", "Exposure"]

Changes = Subscription[None]

JOURNAL_KEPT = 65_536  # devices the journal remembers; a reader further behind starts afresh


class Exposure:
    """The per-device tools the model may see, by MCP name.

    ``version`` grows with every change of what hosts see.
    """

    def __init__(self) -> None:
        """Start with nothing shown."""
        self._snapshot: tuple[DeviceTool, ...] | None = None
        self._changes: Broadcast[None] = Broadcast()
        self.version = 0
        self._journal: list[Device] = []
        self._journal_start = 0  # the mark of the journal's first entry

    @property
    def mark(self) -> int:
        """Where the journal stands now: what ``changed_since`` takes."""
        return self._journal_start + len(self._journal)

    def changed_since(self, mark: int) -> list[Device] | None:
        """The devices shown, hidden or shown again since ``mark`` (repeats included), or
        None when the journal no longer reaches back that far (read the whole fleet then).

        A device shown again while it is shown counts too: it may have come back online, which
        changes whether a listing that leaves out long-gone devices lists it.
        """
        if mark < self._journal_start:
            return None
        return self._journal[mark - self._journal_start :]

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
        self._note(device)
        if device.exposed or device.decisions is None or not device.decisions.by_name:
            return
        device.exposed = True
        self._changed()

    def hide(self, device: Device) -> None:
        """Take the tools of ``device`` out of what hosts see, if they are shown."""
        self._note(device)
        if not device.exposed:
            return
        device.exposed = False
        self._changed()

    def _note(self, device: Device) -> None:
        journal = self._journal
        journal.append(device)
        if len(journal) > JOURNAL_KEPT:  # the older half goes: amortised, one entry a change
            dropped = len(journal) // 2
            del journal[:dropped]
            self._journal_start += dropped

    def _changed(self) -> None:
        self.version += 1
        self._snapshot = None
        self._changes.publish(None)
