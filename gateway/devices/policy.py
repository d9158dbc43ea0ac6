"""Which device tools the model may see and call, and the hints hosts get about them.

User-only tools (``annotations.audience == ["user"]``: reboot, firmware upgrade, ...) belong to
the person at the dashboard, not the model, so they stay hidden unless the device's config names
them in ``user_tools``. ``allow``/``deny`` globs narrow what is left. Globs match the device's own
tool name (``self.lamp.*``) or the same name without ``self.`` (``lamp.*``).
"""

from __future__ import annotations

import fnmatch
import re

from gateway.config import DeviceOptions

__all__ = ["refusal", "tool_hints"]

_READ_ONLY = re.compile(r"(^|[._])(get|read|list|status|info|query|describe)([._]|$)")
_DESTRUCTIVE = re.compile(r"(^|[._])(reboot|restart|reset|upgrade|erase|format|factory|delete)")


def _matches(tool_name: str, patterns: tuple[str, ...]) -> bool:
    bare = tool_name.removeprefix("self.")
    return any(fnmatch.fnmatchcase(tool_name, p) or fnmatch.fnmatchcase(bare, p) for p in patterns)


def refusal(
    name: str, user_only: bool, options: DeviceOptions, *, user: bool = False
) -> str | None:
    """Why the tool ``name`` may not be used under ``options``, or None when it may.

    ``user_only`` is True for a tool the device marks for the user only (xiaozhi-protocol.md §4:
    ``annotations.audience == ["user"]``); ``user`` is True for the person at the CLI or
    dashboard, who may use those.
    """
    if user_only and not user and not _matches(name, options.user_tools):
        return f"{name} is a user-only tool (name it in the device's user_tools to allow it)"
    if not _matches(name, options.allow) or _matches(name, options.deny):
        return f"{name} is not allowed by the device's allow/deny policy"
    return None


def tool_hints(tool_name: str) -> dict[str, bool]:
    """MCP annotation hints guessed from a device tool's name (all hints, never promises)."""
    if _READ_ONLY.search(tool_name):
        return {"readOnlyHint": True, "destructiveHint": False}
    if _DESTRUCTIVE.search(tool_name):
        return {"readOnlyHint": False, "destructiveHint": True}
    return {"readOnlyHint": False, "destructiveHint": False}
