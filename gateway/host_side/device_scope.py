"""Which devices one caller may see and call: a named host token's, or an OAuth app's grant.

A ``DeviceScope`` is a list of device ids and globs on device names (``kitchen*``); a caller
without one (the host token, stdio, tokenless loopback, an app granted all devices) sees every
device. Everything a host can reach asks the same ``sees``: ``tools/list``, ``list_devices`` (and
so the fleet panel), the photo resources, and every way of calling a tool. A device outside the
scope is answered as one that does not exist, so a limited caller cannot even learn its name.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

__all__ = ["DeviceScope", "Named", "scope_of", "scope_words"]


class Named(Protocol):
    """What a scope looks at of a device."""

    @property
    def device_id(self) -> str: ...  # noqa: D102

    @property
    def alias(self) -> str: ...  # noqa: D102


@dataclass(frozen=True, slots=True)
class DeviceScope:
    """Some devices: each pattern is a device id or a glob on the id or the name (any case)."""

    patterns: tuple[str, ...]

    def sees(self, device: Named) -> bool:
        """True when ``device`` is one of this scope's."""
        device_id, alias = device.device_id.lower(), device.alias.lower()
        for pattern in self.patterns:
            if fnmatch.fnmatchcase(device_id, pattern) or fnmatch.fnmatchcase(alias, pattern):
                return True
        return False


def scope_of(patterns: Iterable[str] | None) -> DeviceScope | None:
    """The scope of ``patterns`` as a token's claims or the config give them; None is all."""
    if patterns is None:
        return None
    return DeviceScope(tuple(sorted({str(p).strip().lower() for p in patterns if str(p).strip()})))


def scope_words(patterns: Iterable[str] | None) -> str:
    """A scope in plain words, as the consent page and Connected apps say it."""
    if patterns is None:
        return "all devices, present and future"
    listed = [str(p) for p in patterns]
    if not listed:
        return "no device"
    return "only " + ", ".join(
        f"devices named like {p}" if any(c in p for c in "*?[") else p for p in listed
    )
