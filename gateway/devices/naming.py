"""MCP tool names for device tools: valid for every host, unique, and stable across restarts.

A name is ``<device alias>_<tool>``, where ``<tool>`` is the device's tool name without its
``self.`` prefix and with every character outside ``[A-Za-z0-9_-]`` turned into ``_``
(``kitchen`` + ``self.audio_speaker.set_volume`` -> ``kitchen_audio_speaker_set_volume``).
Claude rejects a *whole server* for one name outside ``^[a-zA-Z0-9_-]{1,64}$``, so longer names
are cut and end in a short hash, and a name already taken gets the hash of its own (device, tool)
pair. ``NameMap`` remembers every assignment so that a collision resolved once stays resolved the
same way after a restart, whichever device connects first.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from gateway.devices.name_rules import (
    MAX_NAME_LENGTH,
    META_TOOL_NAMES,
    NAME_PATTERN,
    candidate_name,
    clean_alias,
    derive_alias,
    disambiguated_name,
    sanitize,
    short_hash,
    tool_suffix,
)

__all__ = [
    "MAX_NAME_LENGTH",
    "META_TOOL_NAMES",
    "NAME_PATTERN",
    "MadeNames",
    "NameAssignment",
    "NameMap",
    "PlainNames",
    "ToolNames",
    "candidate_name",
    "clean_alias",
    "derive_alias",
    "disambiguated_name",
    "sanitize",
    "short_hash",
    "tool_suffix",
]


@dataclass(frozen=True, slots=True)
class NameAssignment:
    """One persisted name: the MCP ``name`` of ``tool`` on ``device_id`` under ``alias``."""

    device_id: str
    tool: str
    alias: str
    name: str


class ToolNames:
    """The tool names of one catalogue, shared by every device that lists it.

    A device's plain names (``<alias>_<tool>``) are not stored: ``NameMap`` makes them from the
    device's alias and this, and finds a plain name's holder by its tool part (``with_suffix``).
    """

    __slots__ = ("_by_suffix", "_json", "distinct", "names", "suffixes")

    def __init__(self, names: Iterable[str] = ()) -> None:
        """The tool names ``names``, in the device's order."""
        self.names = tuple(names)
        # each tool's name part: a listing asks for every name at every page request
        self.suffixes = {tool: tool_suffix(tool) for tool in self.names}
        self._by_suffix: dict[str, tuple[str, ...]] = {}
        for tool, suffix in self.suffixes.items():
            self._by_suffix[suffix] = (*self._by_suffix.get(suffix, ()), tool)
        # no two tools share a name part (nor a name): their plain names cannot collide
        self.distinct = len(self._by_suffix) == len(self.names)
        self._json: str | None = None

    def to_json(self) -> str:
        """The names as a JSON list (made once: every device of the catalogue stores it)."""
        if self._json is None:
            self._json = json.dumps(self.names)
        return self._json

    def __contains__(self, tool: object) -> bool:
        return tool in self.suffixes

    def with_suffix(self, suffix: str) -> tuple[str, ...]:
        """The tools whose name part (``tool_suffix``) is ``suffix``."""
        return self._by_suffix.get(suffix, ())


_NO_TOOLS = ToolNames()


@dataclass(frozen=True, slots=True)
class PlainNames:
    """Every tool of ``tools`` on ``device_id`` under its plain name: what ``NameMap.assign_all``
    made at once, kept (and persisted) as one object, its assignments spelled out on demand."""

    device_id: str
    alias: str
    prefix: str  # clean_alias(alias)
    tools: ToolNames

    def __len__(self) -> int:
        return len(self.tools.names)

    def rows(self) -> list[tuple[str, str, str, str]]:
        """(device_id, tool, alias, name) of each tool: the store's rows."""
        device_id, alias, prefix = self.device_id, self.alias, self.prefix
        return [(device_id, tool, alias, f"{prefix}_{suffix}")
                for tool, suffix in self.tools.suffixes.items()]  # fmt: skip

    def entries(self) -> list[NameAssignment]:
        """Each assignment, in the tools' order."""
        return [NameAssignment(*row) for row in self.rows()]


MadeNames = list[NameAssignment] | PlainNames
"""Names just made, to persist: one by one, or a whole catalogue's at once."""


class _Held:
    """The names one device holds: plain ones implied by ``tools``, the rest in ``special``."""

    __slots__ = ("alias", "device_id", "prefix", "special", "tools")

    def __init__(self, device_id: str, alias: str) -> None:
        self.device_id = device_id
        self.tools = _NO_TOOLS  # its tools that hold their plain names unless in ``special``
        self.special: dict[str, NameAssignment] | None = None  # by tool: names held one by one
        self.alias = self.prefix = alias
        self.rename(alias)

    def rename(self, alias: str) -> None:
        """Imply plain names under ``alias`` from now on (``tools`` emptied first)."""
        prefix = clean_alias(alias)
        self.alias, self.prefix = alias, alias if prefix == alias else prefix  # one string if equal

    def plain(self, tool: str) -> str:
        return f"{self.prefix}_{tool_suffix(tool)}"

    def name_of(self, tool: str) -> str | None:
        special = self.special
        if special is not None and (entry := special.get(tool)) is not None:
            return entry.name
        suffix = self.tools.suffixes.get(tool)
        return f"{self.prefix}_{suffix}" if suffix is not None else None

    def entry(self, tool: str) -> NameAssignment | None:
        if self.special is not None and (entry := self.special.get(tool)) is not None:
            return entry
        if tool in self.tools:
            return NameAssignment(self.device_id, tool, self.alias, self.plain(tool))
        return None


class NameMap:
    """Assigns MCP names to (device, tool) pairs and remembers them.

    Feed it the assignments saved earlier; ``assign`` returns the name for a pair and whether it is
    new (so the caller persists it). A pair keeps its name as long as its device keeps its alias.

    A fleet holds hundreds of thousands of names, almost all plain (``<alias>_<tool>``): once a
    device's tools are assigned, ``share`` lets it hold those through its catalogue's shared
    ``ToolNames`` instead of a string and an entry each (``lookup`` finds a plain name's holder
    by its alias part and its tool part). Only the other names (cut, disambiguated, under an
    older alias, or of tools the device no longer lists) are kept one by one.

    A joining device of a known firmware takes its whole catalogue at once (``assign_all``):
    when none of its plain names is taken, it holds them through the shared ``ToolNames`` at
    once, with no entry made, searched or deleted per tool.
    """

    def __init__(self, saved: Iterable[NameAssignment] = ()) -> None:
        self._held: dict[str, _Held] = {}
        self._special: dict[str, NameAssignment] = {}  # by name: the names held one by one
        self._by_prefix: dict[str, list[_Held]] = {}  # clean alias -> the devices named under it
        # Every head of a listed clean alias that ends before one of its underscores, with how
        # many aliases have it: ``a_b`` (listed) makes ``a_b_c`` of ``a`` and ``b.c`` collide.
        self._heads: dict[str, int] = {}
        for entry in saved:
            held = self._held.get(entry.device_id) or self._hold(entry.device_id, entry.alias)
            self._keep(held, entry)

    def assign(self, device_id: str, alias: str, tool: str) -> tuple[NameAssignment, bool]:
        """The name for ``tool`` on ``device_id``; the flag is True if it was just made."""
        held = self._held.get(device_id)
        known = held.entry(tool) if held is not None else None
        if known is not None and known.alias == alias:
            return known, False
        if held is None:
            held = self._hold(device_id, alias)
        elif held.alias != alias:
            self._rename(held, alias)
        if known is not None:  # the device was renamed: the tool's old name is free again
            self._drop(held, tool)
        name = candidate_name(alias, tool)
        attempt = 0
        while name in META_TOOL_NAMES or self.lookup(name) not in (None, (device_id, tool)):
            name = disambiguated_name(candidate_name(alias, tool), device_id, tool, attempt)
            attempt += 1
        entry = NameAssignment(device_id, tool, alias, name)
        self._keep(held, entry)
        return entry, True

    def assign_all(self, device_id: str, alias: str, tools: ToolNames) -> MadeNames:
        """Assign every tool of ``tools`` on ``device_id``, which then holds its plain names
        through ``tools`` (``assign`` each, then ``share``); return the names just made."""
        if not self._plain_names_free(device_id, alias, tools):
            made = [e for tool in tools.names for e, new in [self.assign(device_id, alias, tool)]
                    if new]  # fmt: skip
            self.share(device_id, tools)
            return made
        held = self._hold(device_id, alias)
        held.tools = tools
        return PlainNames(device_id, alias, held.prefix, tools)

    def _plain_names_free(self, device_id: str, alias: str, tools: ToolNames) -> bool:
        """True if ``device_id`` holds no name yet and no other pair holds any plain name of
        ``tools`` under ``alias`` (each valid as it is).

        The holder of another plain name ``<q>_<t>`` equal to ``<prefix>_<suffix>`` has ``q``
        equal to ``prefix`` or to a head of it (found here once per device, not per tool), or
        ``q`` longer, starting with ``prefix_`` (``_heads`` says whether any does: then each
        name is searched as ``lookup`` does).
        """
        if device_id in self._held or not tools.distinct:
            return False
        prefix = clean_alias(alias)
        walk = prefix in self._heads
        namesakes = [  # (a device under a head of the prefix, what its tool part starts with)
            (held, prefix[len(head) + 1 :] + "_" if head != prefix else "")
            for head in [*_heads_of(prefix), prefix]
            for held in self._by_prefix.get(head, ())
        ]
        special = self._special
        for suffix in tools.suffixes.values():
            name = f"{prefix}_{suffix}"
            if len(name) > MAX_NAME_LENGTH or name in META_TOOL_NAMES or name in special:
                return False
            for held, start in namesakes:
                if any(held.special is None or tool not in held.special
                       for tool in held.tools.with_suffix(start + suffix)):  # fmt: skip
                    return False
            if walk and self.lookup(name) is not None:
                return False
        return True

    def share(self, device_id: str, tools: ToolNames) -> None:
        """Let ``device_id``, whose tools are now ``tools`` (each assigned), hold their plain
        names through ``tools``; names of tools it no longer lists are kept one by one."""
        held = self._held.get(device_id)
        if held is None or held.tools is tools:
            return
        self._spell_out(held, keep=tools)
        held.tools = tools
        special = held.special or {}
        for tool in tools.names:
            entry = special.get(tool)
            if entry is not None and entry.alias == held.alias and entry.name == held.plain(tool):
                del special[tool], self._special[entry.name]
        held.special = special or None

    def name_of(self, device_id: str, tool: str) -> str | None:
        """The name ``tool`` on ``device_id`` holds, if any."""
        held = self._held.get(device_id)
        return held.name_of(tool) if held is not None else None

    def forget(self, device_id: str) -> None:
        """Free every name of ``device_id`` (the device is gone for good)."""
        held = self._held.pop(device_id, None)
        if held is None:
            return
        for entry in (held.special or {}).values():
            if self._special.get(entry.name) is entry:
                del self._special[entry.name]
        self._unlist(held)

    def lookup(self, name: str) -> tuple[str, str] | None:
        """The (device_id, tool) pair that ``name`` stands for, if any."""
        entry = self._special.get(name)
        if entry is not None:
            return entry.device_id, entry.tool
        cut = name.find("_")
        while cut > 0:  # a plain name: <alias>_<tool>, where either part may hold underscores
            for held in self._by_prefix.get(name[:cut], ()):
                for tool in held.tools.with_suffix(name[cut + 1 :]):
                    if held.special is None or tool not in held.special:
                        return held.device_id, tool
            cut = name.find("_", cut + 1)
        return None

    def entries(self) -> list[NameAssignment]:
        """Every assignment, for persisting."""
        found = []
        for held in self._held.values():
            special = held.special or {}
            found += [e for tool in held.tools.names if (e := held.entry(tool)) is not None
                      and tool not in special]  # fmt: skip
            found += special.values()
        return found

    def _hold(self, device_id: str, alias: str) -> _Held:
        held = self._held[device_id] = _Held(device_id, alias)
        self._list(held)
        return held

    def _list(self, held: _Held) -> None:
        namesakes = self._by_prefix.setdefault(held.prefix, [])
        namesakes.append(held)
        if len(namesakes) == 1:
            heads = self._heads
            for head in _heads_of(held.prefix):
                heads[head] = heads.get(head, 0) + 1

    def _unlist(self, held: _Held) -> None:
        namesakes = self._by_prefix[held.prefix]
        namesakes.remove(held)
        if not namesakes:
            del self._by_prefix[held.prefix]
            heads = self._heads
            for head in _heads_of(held.prefix):
                heads[head] -= 1
                if not heads[head]:
                    del heads[head]

    def _rename(self, held: _Held, alias: str) -> None:
        """Its names so far stay, one by one, until each is assigned again under ``alias``."""
        self._spell_out(held, keep=_NO_TOOLS)
        held.tools = _NO_TOOLS
        self._unlist(held)
        held.rename(alias)
        self._list(held)

    def _spell_out(self, held: _Held, keep: ToolNames) -> None:
        """Keep one by one the implied names of ``held``'s tools that are not in ``keep``."""
        for tool in held.tools.names:
            if tool not in keep and (held.special is None or tool not in held.special):
                self._keep(held, NameAssignment(held.device_id, tool, held.alias, held.plain(tool)))

    def _keep(self, held: _Held, entry: NameAssignment) -> None:
        """``held``'s device holds ``entry`` one by one."""
        if held.special is None:
            held.special = {}
        self._drop(held, entry.tool)
        held.special[entry.tool] = entry
        self._special[entry.name] = entry

    def _drop(self, held: _Held, tool: str) -> None:
        old = held.special.pop(tool, None) if held.special is not None else None
        if old is not None and self._special.get(old.name) is old:
            del self._special[old.name]


def _heads_of(prefix: str) -> list[str]:
    """The heads of ``prefix`` that end before one of its underscores."""
    return [prefix[:cut] for cut, c in enumerate(prefix) if c == "_" and cut > 0]
