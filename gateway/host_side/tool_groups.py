"""Grouped tools (``[tools] mode = "grouped"``): a tool that devices share, listed once.

Devices share a tool when they list it with the same name and schema; the group is listed
under the tool's name (``tool_suffix``) with a required ``device`` argument that routes the
call, or under that name and a short hash when tools of other schemas (or other names that
clean to the same) are grouped too, or when the name is a meta-tool's. Groups are listed in the
order of their first appearance in the per-device listing (devices by alias, tools in device
order): a fleet of one firmware keeps its tools in the firmware's order.

``Groups`` is kept up to date device by device (``add``, ``remove``): a device that joins costs
its own tools, however many devices share them, and never a pass over the fleet. What only the
whole group could tell is kept as it changes: its members by device id, how many of them are
not read-only or are destructive (the hints hosts get), and its first member (a heap).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterator

from gateway.devices.catalogue import ToolSpec
from gateway.devices.device import Device, DeviceTool
from gateway.devices.naming import MAX_NAME_LENGTH, META_TOOL_NAMES, short_hash, tool_suffix

__all__ = ["Groups", "OrderKey", "ToolGroup"]

OrderKey = tuple[str, str]  # (alias, device id): where a device stands in the listing
GroupKey = tuple[str, str]  # (tool name, schema key)
_Place = tuple[OrderKey, int]  # (its device's order key, tool index): where a group stands


class ToolGroup:
    """One tool that several devices share, listed once with an argument naming the device."""

    __slots__ = ("_find", "argument", "destructive", "heap", "key", "members", "order_keys",
                 "name", "place", "writers")  # fmt: skip

    def __init__(self, key: GroupKey, argument: str, find: Callable[[str], Device | None]) -> None:
        self.key = key
        self.name = ""  # given by Groups (it depends on the other groups)
        self.argument = argument  # names the device ("device" unless the tool has one)
        self.members: dict[str, DeviceTool] = {}  # by device id
        self.writers = 0  # members not read-only
        self.destructive = 0  # members that are destructive
        self.place: _Place | None = None  # where it stands in the listing (its first member)
        self.heap: list[OrderKey] = []  # members' order keys, stale ones left until on top
        self.order_keys: dict[str, OrderKey] = {}  # each member's order key (checks the heap)
        self._find = find

    @property
    def spec(self) -> ToolSpec:
        """The tool as its first member lists it."""
        return self.members[self.top()[1]].spec

    @property
    def count(self) -> int:
        """How many devices offer it."""
        return len(self.members)

    def member(self, ref: str) -> DeviceTool | None:
        """The member tool on the device whose alias or id is ``ref``."""
        device = self._find(ref) or self._find(ref.lower())
        return self.members.get(device.device_id) if device is not None else None

    def aliases(self, most: int) -> list[str]:
        """The first ``most`` devices' aliases, in list order."""
        first = heapq.nsmallest(most, self.members.values(), key=_device_order)
        return [tool.device.alias for tool in first]

    def within(self, sees: Callable[[Device], bool]) -> ToolGroup | None:
        """This group as a caller that sees only some devices sees it: its members among them
        (the group itself when it sees them all, None when it sees none)."""
        kept = {key: tool for key, tool in self.members.items() if sees(tool.device)}
        if len(kept) == len(self.members):
            return self
        if not kept:
            return None
        view = ToolGroup(self.key, self.argument, self._find)
        view.name, view.place, view.members = self.name, self.place, kept
        for device_id, tool in kept.items():
            view.order_keys[device_id] = self.order_keys[device_id]
            view.writers += not tool.hints.read_only
            view.destructive += tool.hints.destructive
        view.heap = list(view.order_keys.values())
        heapq.heapify(view.heap)
        return view

    def remove(self, device_id: str) -> None:
        tool = self.members.pop(device_id)
        del self.order_keys[device_id]
        self.writers -= not tool.hints.read_only
        self.destructive -= tool.hints.destructive
        if len(self.heap) > 2 * len(self.members) + 16:  # stale keys: made again, amortised
            self.heap = list(self.order_keys.values())
            heapq.heapify(self.heap)

    def top(self) -> OrderKey:
        """The first member's order key (stale keys on top are dropped)."""
        heap = self.heap
        while self.order_keys.get(heap[0][1]) is not heap[0]:
            heapq.heappop(heap)
        return heap[0]


def _device_order(tool: DeviceTool) -> OrderKey:
    return (tool.device.alias, tool.device.device_id)


class Groups:
    """The groups of the listed tools, kept in listing order as devices come and go."""

    def __init__(
        self,
        find: Callable[[str], Device | None],
        placed: Callable[[str], tuple[DeviceTool, ...]],
    ) -> None:
        """Start with none; ``find`` resolves a device by alias or id (the registry's),
        ``placed`` gives the tools a device was added with (where a group's first member is)."""
        self._find = find
        self._placed = placed
        self._groups: dict[GroupKey, ToolGroup] = {}
        self.by_name: dict[str, ToolGroup] = {}
        self._suffixes: dict[str, list[ToolGroup]] = {}  # the groups whose names clean alike
        self.ordered: list[tuple[_Place, ToolGroup]] = []  # listing order
        self.changed = False  # the order, a name or the set of groups changed since cleared

    def __len__(self) -> int:
        return len(self.ordered)

    def __iter__(self) -> Iterator[ToolGroup]:
        return (group for _, group in self.ordered)

    def add(self, order: OrderKey, tools: tuple[DeviceTool, ...]) -> None:
        """Add the device at ``order`` with its listed ``tools`` to their groups."""
        device_id = order[1]
        for index, tool in enumerate(tools):  # the fleet's first listing runs this per tool
            spec = tool.spec
            key = (spec.name, spec.schema_key)
            group = self._groups.get(key)
            if group is None:
                group = self._groups[key] = self._made(key, spec)
            group.members[device_id] = tool
            group.order_keys[device_id] = order
            heapq.heappush(group.heap, order)
            hints = tool.hints
            group.writers += not hints.read_only
            group.destructive += hints.destructive
            if group.place is None or order < group.place[0]:  # one tool a device per group
                self._move(group, (order, index))

    def remove(self, order: OrderKey, tools: tuple[DeviceTool, ...]) -> None:
        """Take the device at ``order`` (as it was added) with its ``tools`` out of them."""
        for tool in tools:
            spec = tool.spec
            group = self._groups[(spec.name, spec.schema_key)]
            group.remove(order[1])
            if not group.members:
                self._drop(group)
            elif group.place is not None and group.place[0][1] == order[1]:
                first = group.top()  # it was the first member: the next one's place
                self._move(group, (first, self._index(group, first[1])))

    def _index(self, group: ToolGroup, device_id: str) -> int:
        return self._placed(device_id).index(group.members[device_id])

    def _move(self, group: ToolGroup, place: _Place) -> None:
        ordered = self.ordered
        if group.place is not None:
            del ordered[bisect.bisect_left(ordered, (group.place,))]
        group.place = place
        bisect.insort(ordered, (place, group), key=lambda entry: entry[0])
        self.changed = True

    def _made(self, key: GroupKey, spec: ToolSpec) -> ToolGroup:
        properties = spec.input_schema.get("properties")
        taken = isinstance(properties, dict) and "device" in properties
        group = ToolGroup(key, "target_device" if taken else "device", self._find)  # never
        # shadow the tool's own argument
        alike = self._suffixes.setdefault(tool_suffix(key[0]), [])
        alike.append(group)
        for named in alike:  # a second schema of a name: the first one's name changes too
            self._name(named, alike)
        return group

    def _drop(self, group: ToolGroup) -> None:
        del self._groups[group.key]
        del self.ordered[bisect.bisect_left(self.ordered, (group.place,))]
        if self.by_name.get(group.name) is group:
            del self.by_name[group.name]
        alike = self._suffixes[tool_suffix(group.key[0])]
        alike.remove(group)
        for named in alike:  # the one left may take the plain name back
            self._name(named, alike)
        if not alike:
            del self._suffixes[tool_suffix(group.key[0])]
        self.changed = True

    def _name(self, group: ToolGroup, alike: list[ToolGroup]) -> None:
        name, schema_key = group.key
        base = tool_suffix(name)[: MAX_NAME_LENGTH - 7]
        if len(alike) > 1 or base in META_TOOL_NAMES:
            base = f"{base}_{short_hash(name, schema_key)}"  # same name, other schemas
        if base == group.name:
            return
        if self.by_name.get(group.name) is group:
            del self.by_name[group.name]
        group.name = base
        self.by_name[base] = group
        self.changed = True
