"""What hosts see in ``tools/list``: the mode, grouped tools, and pages served from a snapshot.

A ``Listing`` is a snapshot of what hosts see, taken once per change (never per request): its
entries in a deterministic order (meta-tools, then devices by alias with their tools in device
order) cut into pages of at most ``PAGE_BYTES``, far under the 1 MiB an SDK client accepts. A
cursor names a listing and where in it the next page starts, and the last few listings are
kept, so a host paging through one listing while devices come and go sees every tool exactly
once; a cursor whose listing is gone (or any other cursor) starts again from the first page of
the current one.

A change costs the change, not the fleet: the lister keeps every listed device in alias order
(and, where the mode may group, the groups: tool_groups.py) and brings them up to date from the
registry's journal of the devices it showed or hid (``changed_since``), looking at each of those
devices once (``listed_tools``); the snapshot then copies references, and a page is cut when it
is asked for. So the first ``tools/list`` after one device joins a fleet of 20,000 looks at that
device (and at those whose names its arrival changed), not at the 20,000. Devices gone for
longer than ``[tools] offline_age`` leave the listing as their time comes (a heap of when to
look at each again), at the next change as before.

A page is served in its wire form (``tools/list`` JSON, plain dicts), never as SDK ``Tool``
models: the SDK validates and dumps every result once more anyway, so a model per tool would be
made and dumped only to be validated again (at 1,000 devices, 25,000 models per pass, a third
of the listing's CPU). A tool's dict costs about a microsecond and shares its schemas with the
device's catalogue, which devices of the same firmware share; nothing is kept between requests.

A caller limited to some devices (``device_scope.py``) pages through the same listing, skipping
the devices it does not see; a group lists only its members among them (``ToolGroup.within``).
What it sees of each device (by id and alias) and of each group are kept per scope, so paging
again, or a change elsewhere in the fleet, does not ask the scope about every device again.

Cache hints (2026-era clients reuse a list for its ``ttlMs``): a few seconds while the fleet
changes, so that a host which does not subscribe to changes sees a board that joins within
them; longer once nothing changed for a while. Always ``private``: the list depends on the
caller (the fleet panel's ``list_devices`` for hosts that render it).

Modes (``[tools] mode``, DESIGN.md "Tool naming"): ``per-device`` lists every device tool by its
own MCP name; ``grouped`` lists a tool that devices share (same name, same schema) once, named
after the tool, with a required ``device`` argument that routes the call; ``meta`` lists only
the meta-tools; ``auto`` is per-device while the device tools fit ``[tools] budget``, grouped
above it. Auto never falls back to meta-tools only: hosts that ignore ``tools/list_changed``
(Claude Code) must find their devices' tools in the first list they get.
"""

from __future__ import annotations

import bisect
import heapq
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from gateway.config import Config
from gateway.devices.registry import Device, DeviceTool, DeviceView
from gateway.host_side.device_scope import DeviceScope
from gateway.host_side.tool_groups import Groups, ToolGroup

__all__ = ["PAGE_BYTES", "Listing", "ToolGroup", "ToolLister", "listed_tools"]

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]

PAGE_BYTES = 200_000  # a page's tools as JSON, about; the reply stays well under 256 KB
ENUM_LIMIT = 64  # a group's `device` argument lists its aliases up to this many devices
_KEPT_LISTINGS = 8  # listings a cursor may still point into
CHANGING_TTL_MS = 2_000  # tools/list cache hint while the fleet changes
SETTLED_TTL_MS = 10_000  # ... once it has not changed for _SETTLED_AFTER
_SETTLED_AFTER = 300.0  # seconds
_KEPT_SCOPES = 32  # scopes whose view of the fleet is kept (a few named tokens and apps)
_SEEN_MOST = 100_000  # devices a scope's view remembers before it starts again
_ENTRY_OVERHEAD = 190  # bytes a tool adds beyond its name, description and schema (measured)

Placement = tuple[str, str, tuple[DeviceTool, ...]]
"""A listed device: its alias and id (where it stands) and the tools it is listed with."""

Entry = Placement | ToolGroup


def listed_tools(device: Device, cutoff: float) -> tuple[DeviceTool, ...]:
    """The tools of ``device`` in the host listing: those the model may use while hosts see
    the device, unless it has been offline since before ``cutoff`` (``[tools] offline_age``).

    The one place the lister looks at a device: a change costs one call per device it concerns.
    """
    if not device.exposed or not (device.online or device.record.last_seen >= cutoff):
        return ()
    return device.shown_tools()


@dataclass(frozen=True, slots=True, eq=False)
class Listing:
    """One snapshot of the tool list; pages are cut from it as hosts ask for them."""

    version: int
    mode: str  # the mode in effect: per-device, grouped or meta
    entries: tuple[Entry, ...]  # listed devices (per-device) or groups (grouped)


class _View:
    """What one scope sees of the listing: per device (id and alias, the glob's input) and,
    for the newest listing it paged, per group."""

    __slots__ = ("groups", "scope", "seen", "version")

    def __init__(self, scope: DeviceScope) -> None:
        self.scope = scope
        self.seen: dict[tuple[str, str], bool] = {}
        self.version = -1
        self.groups: dict[str, ToolGroup | None] = {}

    def sees(self, device: Device) -> bool:
        key = (device.device_id, device.alias)
        found = self.seen.get(key)
        if found is None:
            if len(self.seen) >= _SEEN_MOST:
                self.seen.clear()
            found = self.seen[key] = self.scope.sees(device)
        return found

    def group(self, listing: Listing, group: ToolGroup) -> ToolGroup | None:
        if listing.version != self.version:
            self.version, self.groups = listing.version, {}
        if group.name not in self.groups:
            self.groups[group.name] = group.within(self.sees)
        return self.groups[group.name]


class ToolLister:
    """Keeps the listing up to date device by device, and answers pages by cursor."""

    def __init__(self, config: Config, registry: DeviceView) -> None:
        self._config = config
        self._registry = registry
        self._listings: OrderedDict[int, Listing] = OrderedDict()
        self._mode = ""
        self._mark = -1  # where in the registry's journal the lister stands (-1: nowhere yet)
        self._placed: dict[str, Placement] = {}  # by device id
        self._order: list[Placement] = []  # by alias and id
        self._count = 0  # tools listed
        self._aging: list[tuple[float, str]] = []  # (when to look at a device again, its id)
        may_group = config.tools_mode in ("auto", "grouped")
        self._groups = Groups(registry.find, self._tools_of) if may_group else None
        self._changed = True  # since the last snapshot
        self._seen_version = -1  # the registry's version at the last snapshot
        self._views: OrderedDict[DeviceScope, _View] = OrderedDict()
        self.changed_at = time.monotonic()  # when the list last changed (as far as hosts know)

    def current(self) -> Listing:
        """The listing of what hosts see now."""
        self._update()
        if self._registry.version != self._seen_version:  # names may change in place too
            self._seen_version, self._changed = self._registry.version, True
        if self._changed or not self._listings:
            version = next(reversed(self._listings), 0) + 1
            self._listings[version] = self._snapshot(version)
            self._changed = False
            self.changed_at = time.monotonic()
            while len(self._listings) > _KEPT_LISTINGS:
                self._listings.popitem(last=False)
        return self._listings[next(reversed(self._listings))]

    def cache_hint(self) -> JsonObject:
        """The ``ttlMs`` and ``cacheScope`` of a ``tools/list`` result now."""
        self.current()  # a change not yet made into a listing is a change now
        settled = time.monotonic() - self.changed_at >= _SETTLED_AFTER
        return {"ttlMs": SETTLED_TTL_MS if settled else CHANGING_TTL_MS, "cacheScope": "private"}

    def page(
        self, cursor: str | None, scope: DeviceScope | None = None
    ) -> tuple[list[JsonObject], bool, str | None]:
        """The device tools of the page ``cursor`` points at (wire form), whether it is the
        first page, and the cursor of the page after it; only ``scope``'s devices, if given."""
        listing, entry, item = self._resolve(cursor)
        view = self._view(scope)
        first = (entry, item) == (0, 0)
        entries, size = listing.entries, 0
        tools: list[JsonObject] = []
        while entry < len(entries):
            found = entries[entry]
            if isinstance(found, ToolGroup):  # a group of an older listing may have emptied
                group = found if view is None or not found.members else view.group(listing, found)
                items: tuple[DeviceTool | ToolGroup, ...] = (
                    (group,) if group and group.members else ()
                )
            else:
                items = found[2]
                if view is not None and items and not view.sees(items[0].device):
                    items = ()
            while item < len(items):
                weight = _weight(items[item])
                if tools and size + weight > PAGE_BYTES:
                    return tools, first, f"{listing.version}.{entry}.{item}"
                tools.append(_wire_tool(items[item]))
                size += weight
                item += 1
            entry, item = entry + 1, 0
        return tools, first, None

    def group(self, name: str, scope: DeviceScope | None = None) -> ToolGroup | None:
        """The group listed as ``name`` now, if any (as a caller limited to ``scope`` sees it:
        None when it sees none of its devices)."""
        listing = self.current()
        if listing.mode != "grouped" or self._groups is None:
            return None
        group = self._groups.by_name.get(name)
        view = self._view(scope)
        return group if group is None or view is None else view.group(listing, group)

    def _view(self, scope: DeviceScope | None) -> _View | None:
        if scope is None:
            return None
        view = self._views.get(scope)
        if view is None:
            view = self._views[scope] = _View(scope)
            while len(self._views) > _KEPT_SCOPES:
                self._views.popitem(last=False)
        else:
            self._views.move_to_end(scope)
        return view

    def input_schema(self, name: str) -> JsonObject | None:
        """The ``inputSchema`` of the tool hosts call ``name`` (a group's has its ``device``)."""
        group = self.group(name)
        if group is not None:
            schema: JsonObject = _group_tool(group)["inputSchema"]
            return schema
        tool = self._registry.lookup(name)
        return tool.spec.input_schema if tool is not None else None

    def _resolve(self, cursor: str | None) -> tuple[Listing, int, int]:
        if cursor:
            parts = cursor.split(".")
            if len(parts) == 3 and all(part.isdigit() for part in parts):
                version, entry, item = (int(part) for part in parts)
                listing = self._listings.get(version)
                if listing is not None and entry < len(listing.entries):
                    found = listing.entries[entry]
                    if item < (1 if isinstance(found, ToolGroup) else len(found[2])):
                        return listing, entry, item
        return self.current(), 0, 0  # first page, or a stale cursor: start again, cleanly

    # --- keeping the listing up to date --------------------------------------------------------

    def _update(self) -> None:
        """Look at the devices that changed since the last look, and at those whose offline
        time is up; the whole fleet only the first time (or when the journal lost track)."""
        changed, mark = self._registry.changed_since(self._mark)
        now = time.time()
        due = bool(self._aging) and self._aging[0][0] <= now
        if mark == self._mark and changed is not None and not due:
            return
        self._mark = mark
        if changed is None:
            self._clear()
            changed = self._registry.devices()
        visit = {device.device_id: device for device in changed}  # the journal repeats
        while self._aging and self._aging[0][0] <= now:
            _, device_id = heapq.heappop(self._aging)
            device = self._registry.get(device_id)
            if device is not None:
                visit.setdefault(device_id, device)
        cutoff = now - self._config.tools_offline_age
        for device in visit.values():
            self._place(device, listed_tools(device, cutoff), now)
        if len(self._aging) > 2 * len(self._placed) + 64:  # stale looks: plan them again
            gone = (placed[2][0].device for placed in self._placed.values())
            self._aging = [(device.record.last_seen + self._config.tools_offline_age,
                            device.device_id) for device in gone if not device.online]  # fmt: skip
            heapq.heapify(self._aging)  # amortised: one entry a look planned

    def _place(self, device: Device, tools: tuple[DeviceTool, ...], now: float) -> None:
        """Put ``device`` where it belongs in the listing with ``tools`` (or out of it)."""
        device_id = device.device_id
        if tools and not device.online:  # listed while offline: look at it again when its
            # time is up (an online device is listed whatever its age; it is journaled as it
            # leaves)
            when = device.record.last_seen + self._config.tools_offline_age
            heapq.heappush(self._aging, (when, device_id))
        old = self._placed.get(device_id)
        if old is not None and old[2] is tools and old[0] == device.alias:
            return  # as it was (a reconnect, a journal repeat)
        if old is not None:
            del self._order[bisect.bisect_left(self._order, (old[0], old[1]))]
            self._count -= len(old[2])
            if self._groups is not None:
                self._groups.remove((old[0], old[1]), old[2])
            del self._placed[device_id]
        if tools:
            key = (device.alias, device_id)
            placement = self._placed[device_id] = (*key, tools)
            self._order.insert(bisect.bisect_left(self._order, key), placement)
            self._count += len(tools)
            if self._groups is not None:
                self._groups.add(key, tools)
        self._changed = True

    def _clear(self) -> None:
        self._placed.clear()
        self._order.clear()
        self._count = 0
        self._aging.clear()
        if self._groups is not None:
            self._groups = Groups(self._registry.find, self._tools_of)
        self._changed = True

    def _tools_of(self, device_id: str) -> tuple[DeviceTool, ...]:
        return self._placed[device_id][2]

    def _snapshot(self, version: int) -> Listing:
        mode = self._effective_mode(self._count)
        entries: tuple[Entry, ...] = ()
        if mode == "per-device":
            entries = tuple(self._order)  # references: no device is looked at
        elif mode == "grouped" and self._groups is not None:
            entries = tuple(self._groups)
        return Listing(version, mode, entries)

    def _effective_mode(self, count: int) -> str:
        mode = self._config.tools_mode
        if mode == "auto":
            budget = self._config.tools_budget
            mode = "per-device" if count <= budget else "grouped"
            if mode != self._mode and mode == "grouped":
                logger.info(
                    "%d device tools exceed the tools budget of %d: listing tools that devices "
                    "share once each, with a `device` argument ([tools] mode and budget)",
                    count,
                    budget,
                )
        self._mode = mode  # the switch to grouped is logged once, not at every listing
        return mode


def _weight(item: DeviceTool | ToolGroup) -> int:
    """About the bytes ``item`` adds to a page (what cuts pages under ``PAGE_BYTES``)."""
    weight = item.spec.size + _ENTRY_OVERHEAD
    if isinstance(item, ToolGroup) and item.count <= ENUM_LIMIT:
        weight += sum(len(a) + 3 for a in item.aliases(ENUM_LIMIT)) * 2
    return weight


def _wire_tool(entry: DeviceTool | ToolGroup) -> JsonObject:
    """The entry as ``tools/list`` lists it (the SDK validates the whole result once more)."""
    if isinstance(entry, ToolGroup):
        return _group_tool(entry)
    spec, alias = entry.spec, entry.device.alias
    tool: JsonObject = {
        "name": entry.name,
        "description": f"[{alias}] {spec.description}",
        "inputSchema": spec.input_schema,  # the catalogue's own, shared: never changed
        "annotations": {
            "title": f"{alias}: {spec.title or spec.name}",
            "readOnlyHint": entry.hints.read_only,
            "destructiveHint": entry.hints.destructive,
        },
    }
    if spec.output_schema is not None:
        tool["outputSchema"] = spec.output_schema
    return tool


def _group_tool(group: ToolGroup) -> JsonObject:
    spec = group.spec
    schema = dict(spec.input_schema)
    device: JsonObject = {"type": "string"}
    if group.count <= ENUM_LIMIT:
        device["enum"] = group.aliases(ENUM_LIMIT)
        device["description"] = "the device to use"
    else:
        device["description"] = f"the device to use: one of {group.count} (list_devices)"
    schema["properties"] = {group.argument: device, **(schema.get("properties") or {})}
    required = schema.get("required")
    schema["required"] = [group.argument, *(required if isinstance(required, list) else [])]
    count = group.count
    where = "1 device" if count == 1 else f"{count} devices"
    tool: JsonObject = {
        "name": group.name,
        "description": f"{spec.description} [on {where}; `{group.argument}` says which]",
        "inputSchema": schema,
        "annotations": {
            "title": spec.title or spec.name,
            "readOnlyHint": group.writers == 0,  # every member read-only
            "destructiveHint": group.destructive > 0,  # any member destructive
        },
    }
    if spec.output_schema is not None:
        tool["outputSchema"] = spec.output_schema
    return tool
