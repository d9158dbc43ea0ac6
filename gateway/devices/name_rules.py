"""How one MCP name is spelled: a tool's part, an alias's, cut with a hash, told apart.

``naming.NameMap`` decides which (device, tool) pair gets which name; these rules only spell
names, the same way in every version and on every replica (persisted names rely on it).
"""

from __future__ import annotations

import functools
import hashlib
import re

__all__ = [
    "MAX_NAME_LENGTH",
    "META_TOOL_NAMES",
    "NAME_PATTERN",
    "candidate_name",
    "clean_alias",
    "derive_alias",
    "disambiguated_name",
    "sanitize",
    "short_hash",
    "tool_suffix",
]

MAX_NAME_LENGTH = 64
NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
META_TOOL_NAMES = frozenset({"list_devices", "call_device_tool", "wait_for_event", "notify_device"})
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


# A joining device asks three times (Device.named, before and at its first listing).
@functools.lru_cache(maxsize=1024)
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
