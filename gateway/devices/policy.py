"""Which device tools the model may see and call, and the hints hosts get about them.

User-only tools (``annotations.audience == ["user"]``: reboot, firmware upgrade, ...) belong to
the person at the dashboard, not the model, so they stay hidden unless the device's config names
them in ``user_tools``. Known tools of third-party device software that act on the computer it
runs on (``HOST_ACTING``) are user-only too, whatever the device claims. ``allow``/``deny`` globs
narrow what is left. Globs match the device's own tool name (``self.lamp.*``) or the same name
without ``self.`` (``lamp.*``).
"""

from __future__ import annotations

import fnmatch
import re
from typing import NamedTuple

from gateway.config import DeviceOptions

__all__ = ["HOST_ACTING", "Hints", "is_user_only", "matching", "refusal", "tool_hints"]

_READ_ONLY = re.compile(r"(^|[._])(get|read|list|status|info|query|describe)([._]|$)")
_DESTRUCTIVE = re.compile(r"(^|[._])(reboot|restart|reset|upgrade|erase|format|factory|delete)")


# Tools that act on the host computer of the device software, not on a board: py-xiaozhi (a
# desktop client of the xiaozhi protocol) starts and kills programs of the machine it runs on.
# A model reaching them through the gateway could run anything there, so only the person at the
# dashboard or CLI may, unless the device's ``user_tools`` names them (docs/security.md).
HOST_ACTING = frozenset({"self.application.launch", "self.application.kill"})


def is_user_only(name: str, claimed: bool) -> bool:
    """Is ``name`` for the user only: the device says so (``claimed``), or it acts on a host."""
    return claimed or name in HOST_ACTING


def _matches(tool_name: str, patterns: tuple[str, ...]) -> bool:
    bare = tool_name.removeprefix("self.")
    return any(fnmatch.fnmatchcase(tool_name, p) or fnmatch.fnmatchcase(bare, p) for p in patterns)


def matching(tool_name: str, patterns: tuple[str, ...]) -> bool:
    """Does one of the globs ``patterns`` name ``tool_name``, as allow/deny match (with or
    without ``self.``)?"""
    return _matches(tool_name, patterns)


def refusal(
    name: str, user_only: bool, options: DeviceOptions, *, user: bool = False
) -> str | None:
    """Why the tool ``name`` may not be used under ``options``, or None when it may.

    ``user_only`` is True for a tool the device marks for the user only (docs/protocol.md §4:
    ``annotations.audience == ["user"]``); ``user`` is True for the person at the CLI or
    dashboard, who may use those.
    """
    if is_user_only(name, user_only) and not user and not _matches(name, options.user_tools):
        why = "" if user_only else " (it acts on the computer the device software runs on)"
        return f"{name} is a user-only tool{why} (name it in the device's user_tools to allow it)"
    if not _matches(name, options.allow) or _matches(name, options.deny):
        return f"{name} is not allowed by the device's allow/deny policy"
    return None


class Hints(NamedTuple):
    """The MCP annotation hints hosts get for a tool (hints, never promises)."""

    read_only: bool
    destructive: bool


# Four possible values, shared: a fleet of ten thousand devices holds no tuple per tool.
_SHARED = {(ro, d): Hints(ro, d) for ro in (False, True) for d in (False, True)}


def _hints(read_only: bool, destructive: bool) -> Hints:
    return _SHARED[(read_only, destructive)]


def tool_hints(
    tool_name: str,
    options: DeviceOptions,
    *,
    read_only: bool | None = None,
    destructive: bool | None = None,
) -> Hints:
    """The hints for ``tool_name``: the config's globs, else the device's own, else a guess.

    The config wins over the device: the user who owns the board knows what a tool does, and a
    device's hints are its own claims (a hostile one may call a destructive tool read-only).
    ``read_only``/``destructive`` are the device's hints, None where it gave none.
    """
    if _matches(tool_name, options.read_only):
        return _hints(True, False)
    if _matches(tool_name, options.destructive):
        return _hints(False, True)
    if read_only is not None or destructive is not None:
        # MCP's defaults for what the device left out: not read-only; destructive unless read-only.
        ro = bool(read_only)
        return _hints(ro, (not ro) if destructive is None else destructive)
    if _READ_ONLY.search(tool_name):
        return _hints(True, False)
    if _DESTRUCTIVE.search(tool_name):
        return _hints(False, True)
    return _hints(False, False)
