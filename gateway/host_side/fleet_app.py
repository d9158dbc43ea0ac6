"""The fleet as an MCP App (extension ``io.modelcontextprotocol/ui``): a device panel in the chat.

A host that negotiated the extension (it lists ``text/html;profile=mcp-app`` in its
``capabilities.extensions``) sees ``list_devices`` carry ``_meta.ui.resourceUri``, finds the
panel in ``resources/list`` and gets the devices as ``structuredContent`` too; it renders the
``ui://`` resource in a sandboxed iframe. Every other host gets exactly what it got before.

The panel is one self-contained HTML document served by the gateway itself: the dashboard's
stylesheet and schema-to-form code inlined (one home for both), no external origin, and a CSP in
its ``_meta.ui`` that allows none. Whatever the panel does goes through the host's MCP session
(``tools/call``, ``resources/read`` over the MCP Apps postMessage bridge), so policy and the audit
log see the host that rendered it, as for any call of that host.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import mcp.types as types
from mcp.server import ServerRequestContext
from mcp.server.apps import APP_MIME_TYPE, EXTENSION_ID, client_supports_apps

from gateway.devices.events import EventStore
from gateway.devices.photos import PhotoStore, photo_uri

__all__ = [
    "APP_MIME_TYPE",
    "EXTENSION_ID",
    "PANEL",
    "PANEL_URI",
    "FleetApp",
    "advertised",
    "panel_html",
]

PANEL_EVENTS = 5  # a device's events the panel shows beside its tools

PANEL_URI = "ui://esp-mcp-gateway/devices.html"
_HERE = Path(__file__).parent
_DASHBOARD = _HERE / "dashboard" / "static"
_PANEL = _HERE / "fleet_panel"
# What the panel may reach beyond itself: nothing. Photos come as data: URIs read through the
# host, scripts and styles are inline (ext-apps' default CSP allows exactly that).
_UI_META: dict[str, Any] = {
    "csp": {"connectDomains": [], "resourceDomains": [], "frameDomains": []},
    "prefersBorder": True,
}

PANEL = types.Resource(
    uri=PANEL_URI,
    name="devices-panel",
    title="Devices",
    description="An interactive panel of the gateway's devices: state, last photo, and a form "
    "per tool. Shown by hosts that support MCP Apps, for list_devices.",
    mime_type=APP_MIME_TYPE,
    _meta={"ui": _UI_META},
)

Context = ServerRequestContext[Any, Any]


@functools.cache
def panel_html() -> str:
    """The panel's document, with the dashboard's stylesheet and form code inlined."""
    page = (_PANEL / "panel.html").read_text(encoding="utf-8")
    parts = {
        "/*STYLE*/": (_DASHBOARD / "style.css").read_text(encoding="utf-8")
        + (_PANEL / "panel.css").read_text(encoding="utf-8"),
        "/*FORMS*/": (_DASHBOARD / "forms.js").read_text(encoding="utf-8"),
        "/*PANEL*/": (_PANEL / "panel.js").read_text(encoding="utf-8"),
    }
    for marker, text in parts.items():
        page = page.replace(marker, text.replace("</", "<\\/"))  # nothing closes its element
    return page


class FleetApp:
    """What the extension changes in the gateway's MCP answers, for hosts that negotiated it."""

    def __init__(self, photos: PhotoStore | None, events: EventStore | None = None) -> None:
        self._photos = photos
        self.events = events

    @staticmethod
    def negotiated(ctx: Context) -> bool:
        """Did this request's host negotiate MCP Apps (with the panel's MIME type)?"""
        return client_supports_apps(ctx)

    @staticmethod
    def with_panel(tool: types.Tool) -> types.Tool:
        """``tool`` pointing at the panel (``_meta.ui.resourceUri``)."""
        meta = {**(tool.meta or {}), "ui": {"resourceUri": PANEL_URI}}
        return tool.model_copy(update={"meta": meta})

    def structured(self, answer: dict[str, Any]) -> dict[str, Any]:
        """``list_devices``'s answer for the panel: each device's latest photo and its last few
        events added (only approved devices' are kept)."""
        devices = []
        for entry in answer.get("devices", []):
            photo = self._photos.latest(entry["id"]) if self._photos is not None else None
            if photo is not None:
                entry = {**entry, "photo": {"uri": photo_uri(entry["device"]),
                                            "taken_at": photo.taken_at}}  # fmt: skip
            recent = self.events.recent(entry["id"])[:PANEL_EVENTS] if self.events else []
            if recent:
                entry = {**entry, "events": [event.shown(entry["device"]) for event in recent]}
            devices.append(entry)
        return {**answer, "devices": devices}

    @staticmethod
    def read(uri: str) -> types.ReadResourceResult | None:
        """The panel, if ``uri`` names it."""
        if uri != PANEL_URI:
            return None
        contents = types.TextResourceContents(
            uri=PANEL_URI, mime_type=APP_MIME_TYPE, text=panel_html(), _meta={"ui": _UI_META}
        )
        return types.ReadResourceResult(contents=[contents])


def advertised() -> dict[str, dict[str, Any]]:
    """The server's ``capabilities.extensions`` entry for MCP Apps."""
    return {EXTENSION_ID: {"mimeTypes": [APP_MIME_TYPE]}}
