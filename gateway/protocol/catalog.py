"""Gathering a device's ``tools/list`` pages into one clean catalogue.

``ToolCatalog`` holds one listing in progress: it normalises every tool entry, follows
``nextCursor`` and refuses cursor loops and runaway page counts. It only digests data; when to
request a page and what state that puts the session in is ``DeviceProtocol``'s business.
"""

from __future__ import annotations

from typing import Any

from gateway.protocol.events import MessageDropped

__all__ = ["ToolCatalog", "normalize_tool"]

JsonObject = dict[str, Any]


class _Stop(Exception):
    """The listing must end before the device's last page; the text says why."""


def _empty_schema() -> JsonObject:
    return {"type": "object", "properties": {}}


def normalize_tool(entry: object) -> JsonObject:
    """Return the tool ``entry`` in the shape MCP hosts expect.

    The result has a string ``name``, a string ``description`` (default ``""``) and an object
    ``inputSchema`` whose ``type`` is ``"object"``, plus ``annotations`` when they are an object.
    Other keys are left out.

    Args:
        entry: one element of a ``tools/list`` result's ``tools`` array.

    Returns:
        A new dict; ``entry`` is not modified.

    Raises:
        ValueError: ``entry`` is not an object or has no non-empty string ``name``.
    """
    if not isinstance(entry, dict):
        raise ValueError("tool is not an object")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("tool has no name")
    description = entry.get("description")
    schema = entry.get("inputSchema")
    if not isinstance(schema, dict):
        schema = _empty_schema()
    elif schema.get("type") != "object":
        schema = {**schema, "type": "object"}
    tool: JsonObject = {
        "name": name,
        "description": description if isinstance(description, str) else "",
        "inputSchema": schema,
    }
    annotations = entry.get("annotations")
    if isinstance(annotations, dict):
        tool["annotations"] = annotations
    return tool


class ToolCatalog:
    """One listing in progress: the tools gathered so far and the page to request next.

    The first page counts as requested when the catalogue is made. After each ``add_page``,
    ``next_cursor`` is the cursor of the page to request, or None when the listing is over;
    ``complete`` turns False when it ended before the device's last page.
    """

    def __init__(self, max_pages: int) -> None:
        """Start a listing that may request at most ``max_pages`` pages."""
        self._max_pages = max_pages
        self._pages = 1
        self._cursors: set[str] = set()
        self._tools: dict[str, JsonObject] = {}
        self.next_cursor: str | None = None
        self.complete = True

    @property
    def tools(self) -> tuple[JsonObject, ...]:
        """The tools gathered so far, in device order."""
        return tuple(self._tools.values())

    def add_page(self, result: object) -> list[MessageDropped]:
        """Take one page's ``tools/list`` result and decide on the next page.

        Args:
            result: the ``result`` of the device's reply.

        Returns:
            A ``MessageDropped`` for every tool entry left out and for the reason the listing
            stopped early, if it did.
        """
        if not isinstance(result, dict) or not isinstance(result.get("tools"), list):
            return [self.stop("malformed tools/list result")]
        dropped = [d for i, e in enumerate(result["tools"]) if (d := self._add(i, e)) is not None]
        try:
            self.next_cursor = self._follow(result.get("nextCursor"))
        except _Stop as exc:
            dropped.append(self.stop(str(exc)))
        return dropped

    def stop(self, reason: str, detail: JsonObject | None = None) -> MessageDropped:
        """End the listing early and return the ``MessageDropped`` that says why."""
        self.next_cursor = None
        self.complete = False
        return MessageDropped(reason, {"pages": self._pages, **(detail or {})})

    def _add(self, index: int, entry: object) -> MessageDropped | None:
        try:
            tool = normalize_tool(entry)
        except ValueError as exc:
            return MessageDropped(str(exc), {"page": self._pages, "index": index})
        if tool["name"] in self._tools:
            return MessageDropped("duplicate tool name", {"name": tool["name"]})
        self._tools[tool["name"]] = tool
        return None

    def _follow(self, cursor: object) -> str | None:
        # An empty string is how some servers spell "no more pages".
        if cursor is None or cursor == "":
            return None
        if not isinstance(cursor, str):
            raise _Stop("malformed nextCursor")
        if cursor in self._cursors:
            raise _Stop("tools/list cursor loop")
        if self._pages >= self._max_pages:
            raise _Stop(f"tools/list stopped after {self._max_pages} pages")
        self._cursors.add(cursor)
        self._pages += 1
        return cursor
