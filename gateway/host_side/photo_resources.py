"""Each device's latest photo as hosts see it: an MCP resource, and the JSON API's photos.

The MCP resource is ``device://<device name>/photo/latest``, and ``device://<name>/photo/<id>``
for each older photo the device keeps (``[vision] photo_history``; the id is when it was taken,
in ms, so it names the same photo while it is kept): ``resources/list`` pages through the devices
that have a photo (by name, the cursor is the last name of a page, so photos arriving meanwhile
never shift a page); ``resources/read`` returns the image as a blob. A call that took a photo
links to its latest URI. The JSON API (``photo_routes``, host listener, for the dashboard and
scripts) lists the photos at ``/api/photos`` and serves each at ``/api/photos/<device id>/latest``.
"""

from __future__ import annotations

import asyncio
import base64
import time
import urllib.parse
from collections.abc import Awaitable, Callable

import mcp.types as types
from mcp import MCPError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.devices.calls import format_time
from gateway.devices.photos import LATEST, Photo, PhotoStore, photo_ref, photo_uri
from gateway.devices.registry import DeviceView
from gateway.host_side.device_scope import DeviceScope

__all__ = ["RESOURCE_NOT_FOUND", "PhotoResources", "photo_routes"]

PAGE_SIZE = 500
# A photo is served as exactly the type its magic bytes proved (image/jpeg or image/png, no
# charset), and browsers may not sniff it into something else: an upload that is a valid PNG
# with a script appended must never run as a page on the host listener's origin.
_NO_SNIFF = {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}
RESOURCE_NOT_FOUND = -32002  # the MCP spec's code for an unknown resource

TEMPLATE = types.ResourceTemplate(
    name="device-photo",
    title="A device's latest photo",
    uri_template=photo_uri("{device}"),
    description="The last photo a device's camera took (its take_photo tool), by device name. "
    "Older ones it keeps are listed as device://{device}/photo/{id}.",
)


class PhotoResources:
    """Answers ``resources/list``, ``resources/templates/list`` and ``resources/read``."""

    def __init__(self, registry: DeviceView, photos: PhotoStore) -> None:
        self._registry = registry
        self._photos = photos

    def list(
        self, cursor: str | None, scope: DeviceScope | None = None
    ) -> types.ListResourcesResult:
        """One page of latest-photo resources, after the device named ``cursor`` (of the
        devices ``scope`` sees, if given)."""
        named = sorted(
            (device.alias, photo)
            for photo in self._photos.photos()
            if (device := self._registry.get(photo.device_id)) is not None
            and (scope is None or scope.sees(device))
        )
        if cursor:
            named = [(alias, photo) for alias, photo in named if alias > cursor]
        resources: list[types.Resource] = []
        for index, (alias, photo) in enumerate(named):
            kept = self._photos.history(photo.device_id)
            if resources and len(resources) + len(kept) > PAGE_SIZE:
                return types.ListResourcesResult(
                    resources=resources, next_cursor=named[index - 1][0]
                )
            resources.append(_resource(alias, photo, LATEST))
            resources += [_resource(alias, older, older.id) for older in kept[1:]]
        return types.ListResourcesResult(resources=resources)

    def templates(self) -> types.ListResourceTemplatesResult:
        """The one template: a device's latest photo by its name."""
        return types.ListResourceTemplatesResult(resource_templates=[TEMPLATE])

    async def read(self, uri: str, scope: DeviceScope | None = None) -> types.ReadResourceResult:
        """The photo ``uri`` names; a device ``scope`` does not see has none, as if unknown.

        Raises:
            MCPError: no such device, or it has no photo (or it cannot be read).
        """
        alias, which = photo_ref(uri) or ("", LATEST)
        device = self._registry.find(alias) if alias else None
        if device is not None and scope is not None and not scope.sees(device):
            device = None
        photo = self._photos.find(device.device_id, which) if device is not None else None
        if device is None or photo is None:
            which = "" if which == LATEST else f" {which} (kept: [vision] photo_history)"
            what = f"device {alias!r} has no photo{which}" if alias else "not a device photo URI"
            raise MCPError(RESOURCE_NOT_FOUND, f"Resource not found: {uri} ({what})")
        try:
            data = await asyncio.to_thread(photo.read)
        except OSError as exc:
            message = f"the photo of {device.alias} cannot be read: {exc.strerror or exc}"
            raise MCPError(RESOURCE_NOT_FOUND, message) from None
        blob = base64.b64encode(data).decode("ascii")
        contents = types.BlobResourceContents(uri=uri, mime_type=photo.mime, blob=blob)
        return types.ReadResourceResult(contents=[contents])


def _resource(alias: str, photo: Photo, which: str) -> types.Resource:
    latest = which == LATEST
    about = (
        f"{'Latest photo' if latest else 'Photo'} of {alias}, taken {format_time(photo.taken_at)}"
    )
    if photo.question:
        about += f" to answer {photo.question[:200]!r}"
    return types.Resource(
        uri=photo_uri(alias, which),
        name=f"{alias}-photo" if latest else f"{alias}-photo-{which}",
        title=f"{alias}: latest photo"
        if latest
        else f"{alias}: photo of {format_time(photo.taken_at)}",
        description=about,
        mime_type=photo.mime,
        size=photo.size,
    )


def photo_routes(
    registry: DeviceView, photos: PhotoStore, guard: Callable[[ASGIApp], ASGIApp]
) -> list[Route]:
    """``/api/photos`` and ``/api/photos/<device id>/latest``, each wrapped in ``guard``."""

    async def listing(request: Request) -> Response:
        entries = []
        for photo in photos.photos():
            device = registry.get(photo.device_id)
            url = f"/api/photos/{urllib.parse.quote(photo.device_id, safe='')}/latest"
            entries.append(
                {
                    **photo.as_json(),
                    "alias": device.alias if device is not None else photo.device_id,
                    "taken_at": _iso(photo.taken_at),
                    "url": url,
                }
            )
        return JSONResponse({"photos": entries}, headers=_NO_SNIFF)

    async def latest(request: Request) -> Response:
        device_id = str(request.path_params["device"]).lower()
        photo = photos.latest(device_id)
        if photo is None:
            return JSONResponse({"error": f"device {device_id!r} has no photo"}, 404, _NO_SNIFF)
        try:
            data = await asyncio.to_thread(photo.read)
        except OSError as exc:
            error = {"error": f"the photo cannot be read: {exc.strerror}"}
            return JSONResponse(error, 404, _NO_SNIFF)
        return Response(data, media_type=photo.mime, headers=_NO_SNIFF)

    return [
        Route("/api/photos", endpoint=guard(_View(listing)), methods=["GET"]),
        Route("/api/photos/{device}/latest", endpoint=guard(_View(latest)), methods=["GET"]),
    ]


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


class _View:
    """A request/response view as a raw ASGI app, so that auth can wrap it."""

    def __init__(self, handler: Callable[[Request], Awaitable[Response]]) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self.handler(Request(scope, receive))
        await response(scope, receive, send)
