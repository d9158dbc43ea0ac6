"""MCP tool names in a cluster: a function of the fleet as it is now, never of its history.

``NameMap`` (naming.py) lets the first device to claim a name keep it, which is right for one
gateway and wrong for several: two replicas that saw devices arrive in different orders would
give the same tool different names. ``FleetNames`` decides by a rule any replica applies alone:
a (device, tool) pair gets its plain name, ``<alias>_<tool>`` (naming.py's candidate), when no
other pair of the fleet claims that name, and a hash of its own (device id, tool) otherwise,
every claimant alike. Replicas that know the same fleet agree on every name, even right after a
network split heals. The price: when a second device takes an alias already in use, the first
device's names change too (hosts are told, as for a rename); aliases are fleet state, agreed on
the broker, so that only happens when two devices are really given one alias.
"""

from __future__ import annotations

from gateway.devices.naming import (
    META_TOOL_NAMES,
    MadeNames,
    NameAssignment,
    ToolNames,
    candidate_name,
    disambiguated_name,
)

__all__ = ["FleetNames"]


class FleetNames:
    """Names by the fleet rule; the interface of ``NameMap`` plus ``release`` and ``displaced``.

    ``assign`` never reports a name as new: there is no history to persist.
    """

    def __init__(self) -> None:
        self._by_device: dict[str, dict[str, NameAssignment]] = {}
        self._by_name: dict[str, NameAssignment] = {}
        self._claims: dict[str, set[tuple[str, str]]] = {}  # plain name -> (device, tool) pairs
        self._unsettled: set[str] = set()  # plain names whose claimants changed

    def assign(self, device_id: str, alias: str, tool: str) -> tuple[NameAssignment, bool]:
        """The name for ``tool`` on ``device_id`` under ``alias`` (never new: see the class)."""
        plain = candidate_name(alias, tool)
        known = self._by_device.get(device_id, {}).get(tool)
        if known is not None and known.alias == alias and known.name == self._rule(plain, known):
            return known, False
        if known is not None:
            self._drop(known)
        self._claims.setdefault(plain, set()).add((device_id, tool))
        self._unsettled.add(plain)
        entry = NameAssignment(device_id, tool, alias, "")
        entry = NameAssignment(device_id, tool, alias, self._rule(plain, entry))
        self._by_device.setdefault(device_id, {})[tool] = entry
        self._by_name[entry.name] = entry
        return entry, False

    def release(self, device_id: str, keep: set[str]) -> None:
        """Free the names of the tools of ``device_id`` not in ``keep`` (no longer listed)."""
        tools = self._by_device.get(device_id, {})
        for tool in [t for t in tools if t not in keep]:
            self._drop(tools[tool])

    def forget(self, device_id: str) -> None:
        """Free every name of ``device_id`` (the device is gone for good)."""
        self.release(device_id, set())
        self._by_device.pop(device_id, None)

    def displaced(self) -> set[str]:
        """The devices whose names the rule now decides otherwise (to decide again); drains."""
        found = set()
        for plain in self._unsettled:
            for device_id, tool in self._claims.get(plain, ()):
                entry = self._by_device[device_id][tool]
                if entry.name != self._rule(plain, entry):
                    found.add(device_id)
        self._unsettled.clear()
        return found

    def assign_all(self, device_id: str, alias: str, tools: ToolNames) -> MadeNames:
        """``assign`` each tool of ``tools`` (nothing new: see the class)."""
        for tool in tools.names:
            self.assign(device_id, alias, tool)
        return []

    def share(self, device_id: str, tools: ToolNames) -> None:
        """Nothing to share: a cluster's names are decided pair by pair (``NameMap.share``)."""

    def name_of(self, device_id: str, tool: str) -> str | None:
        """The name ``tool`` on ``device_id`` holds, if any."""
        entry = self._by_device.get(device_id, {}).get(tool)
        return entry.name if entry is not None else None

    def lookup(self, name: str) -> tuple[str, str] | None:
        """The (device_id, tool) pair that ``name`` stands for, if any."""
        entry = self._by_name.get(name)
        return (entry.device_id, entry.tool) if entry is not None else None

    def entries(self) -> list[NameAssignment]:
        """Every assignment (nothing to persist: the rule decides again after a restart)."""
        return [entry for tools in self._by_device.values() for entry in tools.values()]

    def _rule(self, plain: str, entry: NameAssignment) -> str:
        """The name of ``entry``, whose plain name (``candidate_name``) is ``plain``: a join
        of 20,000 devices at start asks this 200,000 times."""
        if plain in META_TOOL_NAMES or len(self._claims.get(plain, ())) > 1:
            return disambiguated_name(plain, entry.device_id, entry.tool, 0)
        return plain

    def _drop(self, entry: NameAssignment) -> None:
        plain = candidate_name(entry.alias, entry.tool)
        claimants = self._claims.get(plain, set())
        claimants.discard((entry.device_id, entry.tool))
        if not claimants:
            self._claims.pop(plain, None)
        self._unsettled.add(plain)
        if self._by_name.get(entry.name) is entry:
            del self._by_name[entry.name]
        tools = self._by_device.get(entry.device_id, {})
        if tools.get(entry.tool) is entry:
            del tools[entry.tool]
