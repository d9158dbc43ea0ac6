"""A device's ``tools/call`` result turned into the MCP result hosts get.

Text stays text; images become image content (stock firmware's nested form too, docs/protocol.md
§4); a link to one of the gateway's own resources (a photo) stays a link; anything else is shown
as its JSON, so nothing a device says is lost.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
from typing import Any

import mcp.types as types

from gateway.devices.photos import alias_of

__all__ = ["call_result", "text_content"]

JsonObject = dict[str, Any]


def text_content(text: str) -> types.TextContent:
    """A text block."""
    return types.TextContent(type="text", text=text)


def call_result(result: JsonObject) -> JsonObject:
    """A device's ``tools/call`` result as the MCP result hosts get, in wire form.

    A dict, not a ``CallToolResult``: the SDK checks a handler's result against the protocol's
    result model either way, and a model made first would be made, checked and dumped once more
    for nothing (some 10 µs a call).
    """
    items = result.get("content")
    wire: JsonObject = {"content": [_content(item) for item in items] if isinstance(items, list)
                        else []}  # fmt: skip
    structured = result.get("structuredContent")
    if isinstance(structured, dict):
        wire["structuredContent"] = structured
    wire["isError"] = result.get("isError") is True
    wire["resultType"] = "complete"  # 2026-era sessions require it; the SDK drops it for others
    return wire


def _text(text: str) -> JsonObject:
    return {"type": "text", "text": text}


def _content(item: object) -> JsonObject:
    if isinstance(item, dict):
        if item.get("type") == "text" and isinstance(item.get("text"), str):
            return _text(item["text"])
        if item.get("type") == "image":
            image = _image(item)
            if image is not None:
                return image
        # Links to the gateway's own resources (a photo); a device's link elsewhere stays text.
        if item.get("type") == "resource_link" and alias_of(str(item.get("uri"))) is not None:
            with contextlib.suppress(ValueError):  # pydantic's ValidationError is a ValueError
                link = types.ResourceLink.model_validate(item)
                return link.model_dump(by_alias=True, mode="json", exclude_none=True)
    return _text(json.dumps(item, ensure_ascii=False))


def _image(item: JsonObject) -> JsonObject | None:
    # docs/protocol.md §4: stock firmware's image content nests a JSON *string* under "image".
    if isinstance(item.get("image"), str):
        try:
            item = json.loads(item["image"])
        except ValueError:
            return None
        if not isinstance(item, dict):
            return None
    data, mime = item.get("data"), item.get("mimeType", "image/jpeg")
    if not isinstance(data, str) or not isinstance(mime, str):
        return None
    try:
        base64.b64decode(data, validate=True)
    except binascii.Error:
        return None
    return {"type": "image", "data": data, "mimeType": mime}
