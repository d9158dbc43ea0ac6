"""A device's MCP logging notification, made an event of that device (docs/events.md).

A device is the MCP server of its session, so it may send ``notifications/message`` with
``level``, ``logger`` and ``data`` (MCP's logging notification) inside the usual envelope: our
firmware does when a button is pressed or a reading changes; stock firmware never does. The core
turns each into ``DeviceLogged``, with ``data`` bounded: nested deeper than ``MAX_DEPTH`` or
longer than ``MAX_DATA_CHARS`` once encoded, it is cut and says so (``CUT_MARK``). Anything that
is not such a notification becomes ``MessageDropped``, never an error of the session.
"""

from __future__ import annotations

import json

from gateway.protocol.events import DeviceLogged, MessageDropped

__all__ = ["CUT_MARK", "LEVELS", "LOGGING_MESSAGE", "MAX_DATA_CHARS", "MAX_DEPTH", "device_logged"]

LOGGING_MESSAGE = "notifications/message"
# MCP's logging levels (RFC 5424 severities), least severe first.
LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
MAX_DATA_CHARS = 4096  # of ``data`` as JSON: an event is a reading, not a payload
MAX_DEPTH = 8  # of nested arrays and objects in ``data``
MAX_LOGGER_CHARS = 64
CUT_MARK = "[cut]"


def device_logged(params: object) -> DeviceLogged | MessageDropped:
    """The event a ``notifications/message`` with ``params`` makes, or why it is dropped."""
    if not isinstance(params, dict):
        return MessageDropped("logging notification without params")
    level = params.get("level")
    if level not in LEVELS:
        return MessageDropped(
            "logging notification with an unknown level", {"level": str(level)[:20]}
        )
    logger = params.get("logger", "")
    if not isinstance(logger, str) or len(logger) > MAX_LOGGER_CHARS:
        return MessageDropped("logging notification with a logger that is not a short string")
    data, cut = _shallow(params.get("data"), MAX_DEPTH)
    text = json.dumps(data, ensure_ascii=False)
    if len(text) > MAX_DATA_CHARS:
        data = f"{text[:MAX_DATA_CHARS]} {CUT_MARK} ({len(text)} characters of JSON)"
        cut = True
    return DeviceLogged(str(level), logger, data, cut)


def _shallow(value: object, depth: int) -> tuple[object, bool]:
    """``value`` with what lies deeper than ``depth`` replaced by ``CUT_MARK``, and whether
    anything was (recursion is bounded by ``depth``, whatever the device sent)."""
    if not isinstance(value, dict | list):
        return value, False
    if depth == 0:
        return CUT_MARK, True
    cut = False
    if isinstance(value, dict):
        shallow: dict[str, object] = {}
        for key, item in value.items():
            shallow[key], deeper = _shallow(item, depth - 1)
            cut = cut or deeper
        return shallow, cut
    items = []
    for item in value:
        kept, deeper = _shallow(item, depth - 1)
        items.append(kept)
        cut = cut or deeper
    return items, cut
