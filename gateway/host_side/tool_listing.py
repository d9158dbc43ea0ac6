"""What hosts see in ``tools/list``: the mode, grouped tools, and pages served from a snapshot.

A ``Listing`` is made from the registry once per change (never per request): its entries in a
deterministic order (meta-tools, then devices by alias with their tools in device order) cut
into pages of at most ``PAGE_BYTES``, far under the 1 MiB an SDK client accepts. A cursor names
a listing and a page, and the last few listings are kept, so a host paging through one listing
while devices come and go sees every tool exactly once; a cursor whose listing is gone (or any
other cursor) starts again from the first page of the current one.

A page is served in its wire form (``tools/list`` JSON, plain dicts), never as SDK ``Tool``
models: the SDK validates and dumps every result once more anyway, so a model per tool would be
made and dumped only to be validated again (at 1,000 devices, 25,000 models per pass, a third
of the listing's CPU). A tool's dict costs about a microsecond and shares its schemas with the
device's catalogue, which devices of the same firmware share; nothing is kept between requests.

Cache hints (2026-era clients reuse a list for its ``ttlMs``): a few seconds while the fleet
changes, so that a host which does not subscribe to changes sees a board that joins within
them; longer once nothing changed for a while. Always ``private``: the list depends on the
caller (the fleet panel's ``list_devices`` for hosts that render it).

A caller limited to some devices (``device_scope.py``) pages through the same listing narrowed
to its devices: made from the listing, not the registry, once per change and scope (the last few
kept), never per request; its cursors name the listing's version as everyone's do.

Modes (``[tools] mode``, DESIGN.md "Tool naming"): ``per-device`` lists every device tool by its
own MCP name; ``grouped`` lists a tool that devices share (same name, same schema) once, named
after the tool, with a required ``device`` argument that routes the call; ``meta`` lists only
the meta-tools; ``auto`` is per-device while the device tools fit ``[tools] budget``, grouped
above it. Auto never falls back to meta-tools only: hosts that ignore ``tools/list_changed``
(Claude Code) must find their devices' tools in the first list they get.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.config import Config
from gateway.devices.catalogue import ToolSpec
from gateway.devices.naming import MAX_NAME_LENGTH, META_TOOL_NAMES, short_hash, tool_suffix
from gateway.devices.registry import DeviceRegistry, DeviceTool
from gateway.host_side.device_scope import DeviceScope

__all__ = ["PAGE_BYTES", "Listing", "ToolGroup", "ToolLister"]

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]

PAGE_BYTES = 200_000  # a page's tools as JSON, about; the reply stays well under 256 KB
ENUM_LIMIT = 64  # a group's `device` argument lists its aliases up to this many devices
_KEPT_LISTINGS = 8  # listings a cursor may still point into
_KEPT_NARROWED = 32  # listings narrowed to a caller's devices, kept (a few per scope in use)
CHANGING_TTL_MS = 2_000  # tools/list cache hint while the fleet changes
SETTLED_TTL_MS = 10_000  # ... once it has not changed for _SETTLED_AFTER
_SETTLED_AFTER = 300.0  # seconds
_ENTRY_OVERHEAD = 190  # bytes a tool adds beyond its name, description and schema (measured)


@dataclass(frozen=True, slots=True, eq=False)
class ToolGroup:
    """One tool that several devices share, listed once with an argument naming the device."""

    name: str
    spec: ToolSpec
    members: tuple[DeviceTool, ...]  # by alias
    argument: str  # the argument that names the device ("device" unless the tool has one)
    _by_ref: dict[str, DeviceTool] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for member in self.members:
            self._by_ref.setdefault(member.device.alias, member)
            self._by_ref.setdefault(member.device.device_id, member)

    def member(self, ref: str) -> DeviceTool | None:
        """The member tool on the device whose alias or id is ``ref``."""
        return self._by_ref.get(ref) or self._by_ref.get(ref.lower())

    def aliases(self, most: int) -> list[str]:
        """The first ``most`` devices' aliases, in list order."""
        return [member.device.alias for member in self.members[:most]]


Entry = DeviceTool | ToolGroup


@dataclass(frozen=True, slots=True, eq=False)
class Listing:
    """One snapshot of the tool list, cut into pages."""

    version: int
    mode: str  # the mode in effect: per-device, grouped or meta
    entries: tuple[Entry, ...]
    pages: tuple[tuple[int, int], ...]  # [start, end) of each page in entries
    groups: dict[str, ToolGroup]


class ToolLister:
    """Makes listings from the registry as it changes, and answers pages by cursor."""

    def __init__(self, config: Config, registry: DeviceRegistry) -> None:
        self._config = config
        self._registry = registry
        self._listings: OrderedDict[int, Listing] = OrderedDict()
        self._narrowed: OrderedDict[tuple[int, DeviceScope], Listing] = OrderedDict()
        self.narrowed_made = 0  # for tests: listings narrowed to a scope (once per change each)
        self._mode = ""
        self.listings_made = 0  # for tests: listings made so far (once per change, not request)
        self.changed_at = time.monotonic()  # when the list last changed (as far as hosts know)

    def current(self) -> Listing:
        """The listing of what hosts see now."""
        version = self._registry.version
        listing = self._listings.get(version)
        if listing is None:
            listing = self._listings[version] = self._make(version)
            self.listings_made += 1
            self.changed_at = time.monotonic()
            while len(self._listings) > _KEPT_LISTINGS:
                self._listings.popitem(last=False)
        return listing

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
        listing, index = self._resolve(cursor, scope)
        start, end = listing.pages[index]
        tools = [_wire_tool(entry) for entry in listing.entries[start:end]]
        following = index + 1
        more = following < len(listing.pages)
        return tools, index == 0, f"{listing.version}.{following}" if more else None

    def group(self, name: str, scope: DeviceScope | None = None) -> ToolGroup | None:
        """The group listed as ``name`` now, if any (to a caller limited to ``scope``)."""
        return self._scoped(self.current(), scope).groups.get(name)

    def _scoped(self, listing: Listing, scope: DeviceScope | None) -> Listing:
        """``listing`` as a caller limited to ``scope`` sees it (made once per scope)."""
        if scope is None:
            return listing
        key = (listing.version, scope)
        narrowed = self._narrowed.get(key)
        if narrowed is None:
            narrowed = self._narrowed[key] = _narrowed(listing, scope)
            self.narrowed_made += 1
            while len(self._narrowed) > _KEPT_NARROWED:
                self._narrowed.popitem(last=False)
        else:
            self._narrowed.move_to_end(key)
        return narrowed

    def input_schema(self, name: str) -> JsonObject | None:
        """The ``inputSchema`` of the tool hosts call ``name`` (a group's has its ``device``)."""
        group = self.group(name)
        if group is not None:
            schema: JsonObject = _group_tool(group)["inputSchema"]
            return schema
        tool = self._registry.lookup(name)
        return tool.spec.input_schema if tool is not None else None

    def _resolve(self, cursor: str | None, scope: DeviceScope | None) -> tuple[Listing, int]:
        if cursor:
            version, _, index = cursor.partition(".")
            listing = self._listings.get(int(version)) if version.isdigit() else None
            if listing is not None:
                listing = self._scoped(listing, scope)
                if index.isdigit() and int(index) < len(listing.pages):
                    return listing, int(index)
        # first page, or a stale cursor: start again, cleanly
        return self._scoped(self.current(), scope), 0

    # --- making a listing ------------------------------------------------------------------

    def _make(self, version: int) -> Listing:
        tools = self._listed_tools()
        mode = self._effective_mode(tools)
        groups: dict[str, ToolGroup] = {}
        entries: Sequence[Entry] = ()
        if mode == "per-device":
            entries = tools
        elif mode == "grouped":
            groups = _groups(tools)
            entries = tuple(groups.values())
        return Listing(version, mode, tuple(entries), _pages(entries), groups)

    def _listed_tools(self) -> list[DeviceTool]:
        """The exposed tools, less those of devices offline for longer than ``offline_age``."""
        cutoff = time.time() - self._config.tools_offline_age
        return [
            tool
            for tool in self._registry.exposed_tools()
            if tool.device.online or tool.device.record.last_seen >= cutoff
        ]

    def _effective_mode(self, tools: list[DeviceTool]) -> str:
        mode = self._config.tools_mode
        if mode == "auto":
            budget = self._config.tools_budget
            mode = "per-device" if len(tools) <= budget else "grouped"
            if mode != self._mode and mode == "grouped":
                logger.info(
                    "%d device tools exceed the tools budget of %d: listing tools that devices "
                    "share once each, with a `device` argument ([tools] mode and budget)",
                    len(tools),
                    budget,
                )
        self._mode = mode  # the switch to grouped is logged once, not at every listing
        return mode


def _groups(tools: list[DeviceTool]) -> dict[str, ToolGroup]:
    """Tools grouped by name and schema, in order of first appearance, named after the tool."""
    members: dict[tuple[str, str], list[DeviceTool]] = {}
    for tool in tools:
        members.setdefault((tool.spec.name, tool.spec.schema_key), []).append(tool)
    bases: dict[str, int] = {}
    for name, _ in members:
        base = tool_suffix(name)
        bases[base] = bases.get(base, 0) + 1
    groups: dict[str, ToolGroup] = {}
    for (name, schema_key), group in members.items():
        base = tool_suffix(name)[: MAX_NAME_LENGTH - 7]
        if bases[tool_suffix(name)] > 1 or base in META_TOOL_NAMES:
            base = f"{base}_{short_hash(name, schema_key)}"  # same name, other schemas
        spec = group[0].spec
        properties = spec.input_schema.get("properties")
        taken = isinstance(properties, dict) and "device" in properties
        argument = "target_device" if taken else "device"  # never shadow the tool's own
        groups[base] = ToolGroup(base, spec, tuple(group), argument)
    return groups


def _narrowed(listing: Listing, scope: DeviceScope) -> Listing:
    """``listing`` with only the devices ``scope`` sees: their tools, and groups of their
    members only (a group's ``device`` argument never names another device)."""
    seen: dict[str, bool] = {}

    def sees(tool: DeviceTool) -> bool:
        device = tool.device
        found = seen.get(device.device_id)
        if found is None:
            found = seen[device.device_id] = scope.sees(device)
        return found

    entries: list[Entry] = []
    groups: dict[str, ToolGroup] = {}
    for entry in listing.entries:
        if isinstance(entry, ToolGroup):
            members = tuple(member for member in entry.members if sees(member))
            if members:
                group = ToolGroup(entry.name, entry.spec, members, entry.argument)
                entries.append(groups.setdefault(entry.name, group))
        elif sees(entry):
            entries.append(entry)
    return Listing(listing.version, listing.mode, tuple(entries), _pages(entries), groups)


def _pages(entries: Sequence[Entry]) -> tuple[tuple[int, int], ...]:
    pages: list[tuple[int, int]] = []
    start, size = 0, 0
    for index, entry in enumerate(entries):
        weight = entry.spec.size + _ENTRY_OVERHEAD
        if isinstance(entry, ToolGroup):
            weight += sum(len(a) + 3 for a in entry.aliases(ENUM_LIMIT)) * 2
        if size + weight > PAGE_BYTES and index > start:
            pages.append((start, index))
            start, size = index, 0
        size += weight
    pages.append((start, len(entries)))
    return tuple(pages)


def _wire_tool(entry: Entry) -> JsonObject:
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
    if len(group.members) <= ENUM_LIMIT:
        device["enum"] = group.aliases(ENUM_LIMIT)
        device["description"] = "the device to use"
    else:
        device["description"] = f"the device to use: one of {len(group.members)} (list_devices)"
    schema["properties"] = {group.argument: device, **(schema.get("properties") or {})}
    required = schema.get("required")
    schema["required"] = [group.argument, *(required if isinstance(required, list) else [])]
    count = len(group.members)
    where = "1 device" if count == 1 else f"{count} devices"
    tool: JsonObject = {
        "name": group.name,
        "description": f"{spec.description} [on {where}; `{group.argument}` says which]",
        "inputSchema": schema,
        "annotations": {
            "title": spec.title or spec.name,
            "readOnlyHint": all(m.hints.read_only for m in group.members),
            "destructiveHint": any(m.hints.destructive for m in group.members),
        },
    }
    if spec.output_schema is not None:
        tool["outputSchema"] = spec.output_schema
    return tool
