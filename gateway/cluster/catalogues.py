"""The catalogues the fleet's records name, by the digest of their accepted tool entries.

A ``P/device/<id>`` record names its catalogue by content (``digest_of`` the accepted entries),
so identical firmware shares one ``P/catalogue/<digest>`` record whatever each replica's local
digests are. Here: the entries known by content digest (read from the broker, or a local
device's own), which of them the broker sent since the last (re)join or re-read, and the
devices whose record names a catalogue not known yet.
"""

from __future__ import annotations

from gateway.devices.catalogue import digest_of
from gateway.devices.registry import KnownDevices

__all__ = ["FleetCatalogues"]


class FleetCatalogues:
    """The fleet's catalogues as this replica knows them."""

    def __init__(self, registry: KnownDevices) -> None:
        self.entries: dict[str, list[object]] = {}  # by content digest
        self.on_broker: set[str] = set()  # sent by the broker since the last (re)join
        self.waiting: dict[str, set[str]] = {}  # content digest -> devices waiting for it
        self._registry = registry
        self._contents: dict[str, str] = {}  # a local catalogue's digest -> its content digest

    def content(self, device_id: str) -> str | None:
        """The content digest of the device's accepted tools here (None: none listed)."""
        device = self._registry.get(device_id)
        if device is None or device.catalogue is None:
            return None
        digest = device.catalogue.digest
        if digest not in self._contents:
            self._contents[digest] = digest_of([t.as_entry() for t in device.catalogue.tools])
        return self._contents[digest]

    def keep(self, device_id: str, digest: str | None) -> list[object] | None:
        """The entries of a local device's catalogue (``digest``) the fleet has not seen yet,
        now kept; None when they are known already."""
        if digest is None or digest in self.entries:
            return None
        device = self._registry.get(device_id)
        if device is None or device.catalogue is None:
            return None
        entries: list[object] = [tool.as_entry() for tool in device.catalogue.tools]
        self.entries[digest] = entries
        return entries
