"""The device listener's Starlette app: the device WebSocket, OTA, camera uploads, /healthz."""

from __future__ import annotations

from collections.abc import Sequence

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from gateway.config import Config
from gateway.device_side.admission import Admission
from gateway.device_side.ota import OtaEndpoint
from gateway.device_side.sessions import DeviceSessions
from gateway.device_side.transports.websocket import DeviceSocketFront, Proxied, device_sockets
from gateway.device_side.vision import Elsewhere, VisionEndpoint, VisionTokens
from gateway.devices.photos import PhotoStore

__all__ = ["build_device_app"]


def build_device_app(
    config: Config,
    admission: Admission,
    sessions: DeviceSessions,
    ota: OtaEndpoint,
    vision: VisionTokens | None,
    photos: PhotoStore,
    *,
    proxied: Proxied | None = None,
    elsewhere: Elsewhere | None = None,
    extra: Sequence[BaseRoute] = (),
) -> DeviceSocketFront:
    """The app the device listener serves; OTA and uploads only where enabled.

    Beside voice servers (docs/voice-proxy.md), ``proxied`` takes over the WebSocket sessions
    of the devices it proxies and ``elsewhere`` forwards the camera uploads the gateway did
    not ask for. ``extra``: routes of the layers above (the cluster broker's login check).
    """

    async def health(request: Request) -> JSONResponse:
        trouble = sessions.trouble() if sessions.trouble is not None else None
        if trouble is not None:  # cluster: cut from the broker, a balancer sends none here
            return JSONResponse({"status": "unavailable", "reason": trouble}, 503)
        return JSONResponse({"status": "ok"})  # anyone on the LAN asks: alive, nothing more

    routes: list[BaseRoute] = []
    if config.ota_enabled:
        routes += ota.routes()
    if vision is not None:
        limit = config.vision_max_photo_bytes
        routes += VisionEndpoint(vision, photos, limit, elsewhere).routes()
    routes += extra
    # The device WebSocket below ASGI, a proxied device's too (the voice proxy takes its
    # socket over), and the check-in.
    direct = device_sockets(admission.websocket, sessions.serve, admission.settle, proxied)
    app = Starlette(routes=[*routes, Route("/healthz", health)])
    return DeviceSocketFront(app, direct, ota.direct)
