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

import functools
import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "MAX_NAME_LENGTH",
    "META_TOOL_NAMES",
    "NAME_PATTERN",
    "NameAssignment",
    "NameMap",
    "candidate_name",
    "derive_alias",
    "disambiguated_name",
    "sanitize",
    "tool_suffix",
]

MAX_NAME_LENGTH = 64
NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
META_TOOL_NAMES = frozenset({"list_devices", "call_device_tool"})
_HASH_LENGTH = 6
_MAX_ALIAS_LENGTH = 32
_INVALID = re.compile(r"[^A-Za-z0-9_-]")


def sanitize(text: str) -> str:
    """Replace every character outside ``[A-Za-z0-9_-]`` with ``_``."""
    return _INVALID.sub("_", text)


def short_hash(*parts: str) -> str:
    """A short, stable hex digest of ``parts``."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:_HASH_LENGTH]


# Every device of a firmware names the same tools, and each of a device's tools its alias: cached
# (bounded: names come from devices).
@functools.lru_cache(maxsize=4096)
def tool_suffix(tool_name: str) -> str:
    """The tool part of an MCP name: ``self.lamp.turn_on`` -> ``lamp_turn_on``."""
    bare = tool_name.removeprefix("self.")
    return sanitize(bare) or "tool_" + short_hash(tool_name)


@functools.lru_cache(maxsize=4096)
def clean_alias(alias: str) -> str:
    """An alias usable as a name prefix (configured names may hold spaces or dots)."""
    cleaned = sanitize(alias.strip())[:_MAX_ALIAS_LENGTH].strip("_-")
    return cleaned or "device_" + short_hash(alias)


def derive_alias(device_id: str, board: str | None) -> str:
    """An alias for a device the config does not name: board name plus the id's last bytes.

    ``derive_alias("aa:bb:cc:dd:ee:ff", "bread-compact-wifi")`` -> ``bread-compact-wifi_eeff``.
    """
    digits = re.sub(r"[^0-9a-f]", "", device_id.lower())
    suffix = digits[-4:] if len(digits) >= 4 else short_hash(device_id)[:4]
    base = sanitize((board or "esp32").lower())[:24].strip("_-") or "esp32"
    return f"{base}_{suffix}"


def candidate_name(alias: str, tool_name: str) -> str:
    """The plain MCP name of ``tool_name`` under ``alias``, cut to 64 characters with a hash."""
    name = f"{clean_alias(alias)}_{tool_suffix(tool_name)}"
    if len(name) <= MAX_NAME_LENGTH:
        return name
    return name[: MAX_NAME_LENGTH - _HASH_LENGTH - 1] + "_" + short_hash(alias, tool_name)


def disambiguated_name(name: str, device_id: str, tool_name: str, attempt: int) -> str:
    """``name`` made unique to (device, tool) by a hash of them (``attempt`` > 0: tried again)."""
    tag = short_hash(device_id, tool_name, *([str(attempt)] if attempt else []))
    return name[: MAX_NAME_LENGTH - _HASH_LENGTH - 1] + "_" + tag


@dataclass(frozen=True, slots=True)
class NameAssignment:
    """One persisted name: the MCP ``name`` of ``tool`` on ``device_id`` under ``alias``."""

    device_id: str
    tool: str
    alias: str
    name: str


class NameMap:
    """Assigns MCP names to (device, tool) pairs and remembers them.

    Feed it the assignments saved earlier; ``assign`` returns the name for a pair and whether it is
    new (so the caller persists it). A pair keeps its name as long as its device keeps its alias.
    """

    def __init__(self, saved: Iterable[NameAssignment] = ()) -> None:
        # By device, then tool: no tuple key per name (a fleet holds hundreds of thousands).
        self._by_device: dict[str, dict[str, NameAssignment]] = {}
        self._by_name: dict[str, NameAssignment] = {}
        for entry in saved:
            self._remember(entry)

    def assign(self, device_id: str, alias: str, tool: str) -> tuple[NameAssignment, bool]:
        """The name for ``tool`` on ``device_id``; the flag is True if it was just made."""
        tools = self._by_device.get(device_id)
        known = tools.get(tool) if tools is not None else None
        if known is not None and known.alias == alias:
            return known, False
        if known is not None:  # the device was renamed: its old names are free again
            del self._by_name[known.name]
        name = candidate_name(alias, tool)
        attempt = 0
        while name in META_TOOL_NAMES or (
            name in self._by_name and not self._free(name, device_id, tool)
        ):
            name = disambiguated_name(candidate_name(alias, tool), device_id, tool, attempt)
            attempt += 1
        entry = NameAssignment(device_id, tool, alias, name)
        self._remember(entry)
        return entry, True

    def forget(self, device_id: str) -> None:
        """Free every name of ``device_id`` (the device is gone for good)."""
        for entry in self._by_device.pop(device_id, {}).values():
            if self._by_name.get(entry.name) is entry:
                del self._by_name[entry.name]

    def lookup(self, name: str) -> tuple[str, str] | None:
        """The (device_id, tool) pair that ``name`` stands for, if any."""
        entry = self._by_name.get(name)
        return (entry.device_id, entry.tool) if entry is not None else None

    def entries(self) -> list[NameAssignment]:
        """Every assignment, for persisting."""
        return [entry for tools in self._by_device.values() for entry in tools.values()]

    def _free(self, name: str, device_id: str, tool: str) -> bool:
        holder = self._by_name.get(name)
        return holder is None or (holder.device_id == device_id and holder.tool == tool)

    def _remember(self, entry: NameAssignment) -> None:
        self._by_device.setdefault(entry.device_id, {})[entry.tool] = entry
        self._by_name[entry.name] = entry
