"""The companion dashboard at ``/`` on the host listener: pages, and the JSON they read.

The pages are hand-written HTML, JS and CSS in ``static/`` (no build step, no CDN). They call
the host listener's JSON API (``/api/call`` with ``user=True``, ``/api/devices/approve`` ...)
and the few endpoints here: the device list as a live SSE feed, a device's tools, rename, the
audit log and the setup facts. Access is the JSON API's: open on loopback without a host
token; with one, a bearer token or a signed-in session (``session.py``). Every route here but
the sign-in page and the static files sits behind the host listener's guard (``routes``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from gateway.config import Config
from gateway.devices.audit import AuditLog
from gateway.devices.events import EventStore
from gateway.devices.registry import DeviceAdmin, DeviceView
from gateway.errors import StorageUnavailable
from gateway.host_side.dashboard.session import (
    COOKIE,
    LIFETIME,
    Sessions,
    actor_of,
    cookie_value,
)
from gateway.host_side.dashboard.views import device_summary, device_tools, setup_facts
from gateway.net.networks import in_networks, networks
from gateway.net.peer import socket_peer
from gateway.net.public import PublicAddress, split_host
from gateway.net.rate_limit import RateLimiter, rate_limited

__all__ = ["Dashboard", "Sessions"]

STATIC = Path(__file__).parent / "static"
KEEPALIVE = 15.0  # seconds between SSE comments, so proxies keep an idle feed open
# At most one device list a second per open tab: in a churning fleet of thousands every join
# would otherwise re-send the whole list; changes meanwhile fold into the next one.
FEED_INTERVAL = 1.0
DASHBOARD_EVENTS = 20  # a device's recent events its panel shows
# Pages run only our own files: no inline script, images from us or data: URLs (tool results).
CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)
PAGE_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}  # fmt: skip

Guard = Callable[[ASGIApp], ASGIApp]
Handler = Callable[[Request], Awaitable[Response]]


class Dashboard:
    """The dashboard's routes and sessions, over the gateway's registry and audit log."""

    def __init__(
        self,
        config: Config,
        known: DeviceView,
        admin: DeviceAdmin,
        audit: AuditLog,
        public: PublicAddress,
        device_token: Callable[[], str],
        came_over_https: Callable[[Request], bool] = lambda request: request.url.scheme == "https",
        device_events: EventStore | None = None,
    ) -> None:
        self.config, self.audit, self.public = config, audit, public
        self.known, self.admin = known, admin  # the devices; the user's decisions on them
        self.device_token = device_token
        # Whether the browser's own connection was HTTPS (to us, or to a proxy the owner
        # trusts): the OAuth origin rules' answer, so the session cookie is Secure exactly when
        # the consent page's are.
        self.came_over_https = came_over_https
        self.sessions = Sessions(config.host_token)
        self.ingress = networks(config.host_ingress_peers)  # Home Assistant's ingress proxy
        self.device_events = device_events  # what devices report

    def routes(self, guard: Guard, endpoint: Callable[[Handler], ASGIApp]) -> list[BaseRoute]:
        """Routes for the host app; ``guard`` requires auth, ``endpoint`` makes a view an app."""

        def api(path: str, handler: Handler, method: str = "GET") -> Route:
            return Route(path, endpoint=guard(endpoint(handler)), methods=[method])

        login = rate_limited(self.login, RateLimiter(per_minute=20, burst=10), "sign-in attempts")
        return [
            Route("/", endpoint=self.index, methods=["GET"]),
            Route("/login", endpoint=self.login_page, methods=["GET"]),
            Route("/login", endpoint=login, methods=["POST"]),
            Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
            api("/api/session", self.session),
            api("/api/logout", self.logout, "POST"),
            api("/api/events", self.events),
            api("/api/device-events", self.device_events_feed),
            api("/api/dashboard/devices", self.devices),
            api("/api/dashboard/tools", self.tools),
            api("/api/devices/rename", self.rename, "POST"),
            api("/api/audit", self.audit_page),
            api("/api/setup", self.setup),
        ]

    # --- pages -------------------------------------------------------------------------------

    async def index(self, request: Request) -> Response:
        """The dashboard, or the sign-in page for a browser that has not signed in."""
        if self._must_sign_in(request) and self.sessions.get(request.cookies.get(COOKIE)) is None:
            return RedirectResponse("login", 303)  # relative: it works behind a path prefix
        return FileResponse(STATIC / "index.html", headers=PAGE_HEADERS)

    async def login_page(self, request: Request) -> Response:
        """The sign-in form (nothing to sign in to without a host token)."""
        if not self._must_sign_in(request):
            return RedirectResponse("./", 303)
        return FileResponse(STATIC / "login.html", headers=PAGE_HEADERS)

    async def login(self, request: Request) -> Response:
        """Exchange the host token for a session cookie."""
        body = await _json(request)
        token = body.get("token") if isinstance(body, dict) else None
        session = self.sessions.login(token) if isinstance(token, str) else None
        if session is None:
            return JSONResponse({"error": "that is not this gateway's host token"}, 401)
        response = JSONResponse({"signed_in": True})
        response.set_cookie(COOKIE, session.id, max_age=int(LIFETIME), path="/", httponly=True,
                            samesite="strict", secure=self.came_over_https(request))  # fmt: skip
        return response

    def _must_sign_in(self, request: Request) -> bool:
        """A host token is set, and the request is not Home Assistant's ingress proxy's."""
        return self.sessions.required and not self._from_ingress(request)

    def _ingress_host(self, request: Request) -> str | None:
        """Home Assistant's host name when its ingress proxies ``request``, else None.

        HA's ingress sets X-Ingress-Path, and X-Forwarded-Host to the name the browser reached
        HA by (homeassistant.local:8123); the add-on's own ports are on that same machine.
        """
        headers = request.headers
        if "x-ingress-path" not in headers or not self._from_ingress(request):
            return None
        forwarded = headers.get("x-forwarded-host") or headers.get("host") or ""
        host = split_host(forwarded.split(",")[0])[0]
        return host or None

    def _from_ingress(self, request: Request) -> bool:
        # The socket's address: X-Forwarded-For is anyone's to write (gateway/net/peer.py).
        return in_networks(socket_peer(request), self.ingress)

    # --- JSON --------------------------------------------------------------------------------

    async def session(self, request: Request) -> Response:
        """The CSRF token this page sends with every change (empty without sign-in)."""
        session = self.sessions.get(request.cookies.get(COOKIE))
        body = {"csrf": session.csrf if session else "", "sign_in": self._must_sign_in(request)}
        return JSONResponse(body, headers={"Cache-Control": "no-store"})

    async def logout(self, request: Request) -> Response:
        """End this browser's session."""
        self.sessions.logout(request.cookies.get(COOKIE))
        response = JSONResponse({"signed_out": True})
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return response

    async def devices(self, request: Request) -> Response:
        """Every device, as the list shows it."""
        return JSONResponse({"devices": self._summaries()})

    async def events(self, request: Request) -> Response:
        """The device list as server-sent events: now, then after every change."""
        return _stream(self._device_feed(self._alive(request)))

    async def device_events_feed(self, request: Request) -> Response:
        """Each event a device reports, as the gateway keeps it (server-sent events)."""
        return _stream(self._event_feed(self._alive(request)))

    def _alive(self, request: Request) -> Callable[[], bool] | None:
        """Whether the browser's session lasts (None: a token, not a session, let it in)."""
        session_id = cookie_value(request.headers.get("cookie", ""))
        signed_in = session_id is not None and "authorization" not in request.headers
        return (lambda: self.sessions.get(session_id) is not None) if signed_in else None

    async def _event_feed(self, alive: Callable[[], bool] | None) -> AsyncIterator[str]:
        if self.device_events is None:
            return
        async with self.device_events.watch() as feed:
            while alive is None or alive():
                try:
                    async with asyncio.timeout(KEEPALIVE):
                        event = await anext(feed)
                except TimeoutError:
                    yield ": keepalive\n\n"
                    continue
                device = self.known.get(event.device_id)
                if device is not None:
                    yield f"event: event\ndata: {json.dumps(event.shown(device.alias))}\n\n"

    async def tools(self, request: Request) -> Response:
        """``?device=``: every tool of one device, user-only ones included."""
        device = self.known.find(request.query_params.get("device", ""))
        if device is None:
            return JSONResponse({"error": "unknown device"}, 404)
        kept = self.device_events.recent(device.device_id) if self.device_events else []
        events = [event.shown(device.alias) for event in kept[:DASHBOARD_EVENTS]]
        return JSONResponse({"device": device_summary(device), "tools": device_tools(device),
                             "events": events})  # fmt: skip

    async def rename(self, request: Request) -> Response:
        """``{device, name}``: a new alias, and new MCP names for the device's tools."""
        body = await _json(request)
        if not isinstance(body, dict):
            return JSONResponse({"error": "expected {device, name}"}, 400)
        ref, name = body.get("device"), body.get("name")
        if not isinstance(ref, str) or not isinstance(name, str) or not 0 < len(name.strip()) <= 32:
            return JSONResponse({"error": "expected {device, name}: name 1 to 32 characters"}, 400)
        device = self.known.find(ref)
        if device is None:
            return JSONResponse({"error": f"unknown device {ref!r}"}, 404)
        try:
            alias = self.admin.rename(device, name)
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, 409)
        try:
            await self.admin.settle("rename", device, actor_of(request), f"to {alias}")
        except StorageUnavailable as exc:  # renamed in memory, not on disk: the user must know
            return JSONResponse({"error": str(exc)}, 503, headers={"Retry-After": "60"})
        return JSONResponse({"renamed": {"device": alias, "id": device.device_id}})

    async def audit_page(self, request: Request) -> Response:
        """Audit records newest first; ``device``, ``outcome`` (or ``failed``), ``kind``,
        ``cursor``."""
        query = request.query_params
        try:
            limit = min(max(int(query.get("limit", "50")), 1), 500)
            page = self.audit.page(
                device=query.get("device") or None,
                outcome=query.get("outcome") or None,
                kind=query.get("kind") or None,
                cursor=query.get("cursor") or None,
                limit=limit,
            )
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, 400)
        page["enabled"] = self.config.audit_log
        return JSONResponse(page)

    async def setup(self, request: Request) -> Response:
        """The device token, device URLs and MCP host configs."""
        host = request.headers.get("host")
        facts = setup_facts(self.config, self.public, self.device_token(), host,
                            self._ingress_host(request))  # fmt: skip
        return JSONResponse(facts, headers={"Cache-Control": "no-store"})

    def _pending(self) -> dict[str, int]:
        """How many devices wait for approval, how many may, and how many were refused."""
        return {"waiting": len(self.known.waiting), "max": self.config.max_pending,
                "refused": self.admin.pending_refused}  # fmt: skip

    def _summaries(self) -> list[dict[str, Any]]:
        return [device_summary(device) for device in self.known.devices()]

    async def _device_feed(self, alive: Callable[[], bool] | None) -> AsyncIterator[str]:
        """The device list now and after changes; it ends when the browser's session does."""
        async with self.known.device_changes() as changes:
            while alive is None or alive():
                yield f"event: devices\ndata: {json.dumps(self._summaries())}\n\n"
                yield f"event: pending\ndata: {json.dumps(self._pending())}\n\n"
                await asyncio.sleep(FEED_INTERVAL)
                while True:
                    try:
                        async with asyncio.timeout(KEEPALIVE):
                            await anext(changes)
                        break
                    except TimeoutError:
                        if alive is not None and not alive():
                            return  # signed out meanwhile
                        yield ": keepalive\n\n"


def _stream(feed: AsyncIterator[str]) -> Response:
    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return StreamingResponse(feed, media_type="text/event-stream", headers=headers)


async def _json(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except ValueError:
        return None
