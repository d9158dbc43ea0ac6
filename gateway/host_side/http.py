"""The host listener: MCP over streamable HTTP (``/mcp``) and legacy SSE, plus a small JSON API.

Every route but ``/healthz`` sits behind the Host/Origin check (DNS rebinding) and, when a host
token is set, behind bearer auth. The SDK's own transport checks are turned off in favour of
``HostOriginGuard``, which covers the JSON API as well as MCP. ``/healthz`` answers anyone, so it
says only that the gateway is alive; how many devices are online is for the host token's holder.
"""

from __future__ import annotations

import fnmatch
import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any

from mcp.server.auth.middleware.bearer_auth import (
    BearerAuthBackend,
    RequireAuthMiddleware,
)
from mcp.server.auth.provider import AccessToken
from mcp.server.sse import SseServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.authentication import AuthenticationBackend, AuthenticationError
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.config import Config
from gateway.devices.calls import CallRouter, format_time
from gateway.devices.device import PENDING
from gateway.devices.photos import PhotoStore
from gateway.devices.registry import Device, DeviceRegistry
from gateway.errors import (
    CallRejected,
    DeviceBusy,
    DeviceError,
    DeviceTimeout,
    GatewayError,
    StorageUnavailable,
)
from gateway.host_side.dashboard import Dashboard
from gateway.host_side.dashboard.session import SessionAuthBackend, actor_of
from gateway.host_side.device_listing import DeviceQuery, list_devices
from gateway.host_side.mcp_server import McpFrontend, resolve_tool
from gateway.host_side.metrics import GatewayMetrics
from gateway.host_side.photo_resources import photo_routes
from gateway.net.addresses import is_wildcard
from gateway.net.rate_limit import configured_limiter, rate_limited

__all__ = ["HostOriginGuard", "build_host_app", "host_patterns"]

_LOOPBACK_HOSTS = ("127.0.0.1:*", "localhost:*", "[::1]:*", "127.0.0.1", "localhost", "[::1]")
_LOOPBACK_ORIGINS = ("http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*")
_SDK_CHECKS_OFF = TransportSecuritySettings(enable_dns_rebinding_protection=False)


def host_patterns(config: Config) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The Host and Origin patterns the host listener accepts."""
    hosts = [*_LOOPBACK_HOSTS, *config.host_allowed_hosts]
    bind = config.host_listen.host
    if is_wildcard(bind):
        # Bound to every interface, the name people use for this machine is anyone's guess;
        # the host token (mandatory off loopback) guards it instead.
        if not config.host_allowed_hosts:
            hosts.append("*")
    elif not config.host_listen.is_loopback:
        hosts += [bind, f"{bind}:*"]
    return tuple(hosts), (*_LOOPBACK_ORIGINS, *config.host_allowed_origins)


def _allowed(value: str, patterns: tuple[str, ...]) -> bool:
    for pattern in patterns:
        if pattern.endswith(":*"):
            if value.startswith(pattern[:-1]) and value[len(pattern) - 1 :].isdigit():
                return True
        elif fnmatch.fnmatchcase(value.lower(), pattern.lower()):
            return True
    return False


def _host_and_origin(scope: Scope) -> tuple[str, str | None]:
    """The request's first Host ("" without one) and Origin headers, in one pass (every call)."""
    host: str | None = None
    origin: str | None = None
    for name, value in scope["headers"]:  # ASGI gives header names in lower case
        if name == b"host" and host is None:
            host = value.decode("latin-1")
        elif name == b"origin" and origin is None:
            origin = value.decode("latin-1")
    return host or "", origin


class HostOriginGuard:
    """ASGI middleware: 421 for a Host, 403 for an Origin outside the allowed patterns."""

    def __init__(self, app: ASGIApp, hosts: tuple[str, ...], origins: tuple[str, ...]) -> None:
        self.app, self.hosts, self.origins = app, hosts, origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check the request, then pass it on."""
        if scope["type"] == "http" and scope["path"] != "/healthz":
            host, origin = _host_and_origin(scope)
            if not _allowed(host, self.hosts):
                await PlainTextResponse("Invalid Host header", 421)(scope, receive, send)
                return
            # The dashboard's own requests carry its origin, which is the (checked) Host: a
            # browser on the LAN address of a wildcard bind is same-origin, not cross-site.
            same_origin = origin in (f"http://{host}", f"https://{host}")
            if origin and not same_origin and not _allowed(origin, self.origins):
                await PlainTextResponse("Invalid Origin header", 403)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class StaticTokenVerifier:
    """The SDK's ``TokenVerifier`` for one shared host token."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()

    async def verify_token(self, token: str) -> AccessToken | None:
        """Accept exactly the configured token."""
        if hmac.compare_digest(token.encode(), self._token):
            return AccessToken(token=token, client_id="host", scopes=[])
        return None


class _SseEndpoint:
    """``GET /sse``: one legacy SSE MCP session per request (an ASGI app, not a view)."""

    def __init__(self, frontend: McpFrontend, transport: SseServerTransport) -> None:
        self.frontend, self.transport = frontend, transport

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = self.frontend.server
        async with self.transport.connect_sse(scope, receive, send) as (read, write):
            await server.run(read, write, server.create_initialization_options())


Enroll = Callable[[str], dict[str, Any]]
AddBoard = Callable[[str, str | None, str | None], dict[str, Any]]  # (url, name, token)


class _Api:
    """The small JSON API the CLI uses (``devices``, ``call``, ``enroll``)."""

    def __init__(self, frontend: McpFrontend, registry: DeviceRegistry, router: CallRouter,
                 enroll: Enroll | None, photos: PhotoStore | None) -> None:  # fmt: skip
        self.frontend, self.registry, self.router = frontend, registry, router
        self._enroll = enroll
        self._photos = photos
        self.trouble: Callable[[], str | None] | None = None
        self.add_board: AddBoard | None = None
        self.forget_board: Callable[[str], None] | None = None

    async def enroll(self, request: Request) -> Response:
        """Issue a token for a board about to be flashed (``esp-mcp-gateway flash``)."""
        try:
            body: Any = json.loads(await request.body())
        except ValueError:
            return JSONResponse({"error": "the body must be JSON"}, 400)
        name = body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str) or not name.strip() or len(name) > 64:
            return JSONResponse({"error": "name must be a string of 1 to 64 characters"}, 400)
        if self._enroll is None:
            return JSONResponse({"error": "this gateway does not issue device tokens"}, 404)
        try:
            return JSONResponse(self._enroll(name.strip()))
        except StorageUnavailable as exc:  # a full or read-only data dir: try again later
            return JSONResponse({"error": str(exc)}, 503, headers={"Retry-After": "60"})

    async def devices(self, request: Request) -> Response:
        """One page of devices; query parameters name, state, board and cursor as list_devices."""
        try:
            query = DeviceQuery(dict(request.query_params))
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, 400)
        return JSONResponse(list_devices(self.registry, query))

    async def call(self, request: Request) -> Response:
        try:
            body: Any = json.loads(await request.body())
        except ValueError:
            return JSONResponse({"error": "the body must be JSON"}, 400)
        if not isinstance(body, dict) or not isinstance(body.get("device"), str):
            return JSONResponse({"error": "expected {device, tool, arguments}"}, 400)
        device = self.registry.find(body["device"])
        if device is None:
            return JSONResponse({"error": f"unknown device {body['device']!r}"}, 404)
        ref, arguments = body.get("tool"), body.get("arguments") or {}
        if not isinstance(ref, str) or not isinstance(arguments, dict):
            return JSONResponse({"error": "tool must be a string, arguments an object"}, 400)
        tool = resolve_tool(self.registry, device, ref)
        if isinstance(tool, str):
            return JSONResponse({"error": tool}, 400)
        try:
            result = await self.router.call(
                tool, arguments, caller=actor_of(request).who, user=True
            )
        except CallRejected as exc:
            return JSONResponse({"error": str(exc)}, 400)
        except DeviceError as exc:
            if isinstance(exc, DeviceBusy):  # come back later, not a broken device
                return JSONResponse({"error": str(exc)}, 503, headers={"Retry-After": "1"})
            return JSONResponse({"error": str(exc)}, 504 if isinstance(exc, DeviceTimeout) else 502)
        return JSONResponse({"result": result})

    async def forget(self, request: Request) -> Response:
        """Remove a device and its names for good (``esp-mcp-gateway devices forget``)."""
        return await self._device_action(request, "forget", self._forget, close=True)

    def _forget(self, device: Device) -> None:
        if self.forget_board is not None:  # a board the gateway connects to: not any more
            self.forget_board(device.device_id)
        self.registry.forget(device)
        if self._photos is not None:
            self._photos.forget(device.device_id)

    async def approve(self, request: Request) -> Response:
        """Let a pending device serve its tools (``esp-mcp-gateway devices approve``)."""
        return await self._device_action(request, "approve", self.registry.approve)

    async def reject(self, request: Request) -> Response:
        """Refuse a device from now on (``esp-mcp-gateway devices reject``)."""
        return await self._device_action(request, "reject", self.registry.reject, close=True)

    async def pair(self, request: Request) -> Response:
        """Approve new devices as they arrive for a while (``esp-mcp-gateway devices pair``)."""
        body = await _json_body(request)
        seconds = body.get("seconds", 120) if isinstance(body, dict) else None
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not 0 < seconds <= 3600
        ):
            return JSONResponse({"error": "seconds must be a number from 1 to 3600"}, 400)
        until = self.registry.pair(float(seconds))
        # Pairing itself is held in memory (a restart ends it); the approvals it makes are saved.
        await self.registry.settle("pair", None, actor_of(request), f"for {seconds:g} s")
        return JSONResponse({"pairing_for": seconds, "until": format_time(until)})

    async def add(self, request: Request) -> Response:
        """Add a board that serves MCP itself by URL, approved (``esp-mcp-gateway devices add``)."""
        body = await _json_body(request)
        fields = [body.get(k) for k in ("url", "name", "token")] if isinstance(body, dict) else []
        if (
            not fields
            or not isinstance(fields[0], str)
            or not all(f is None or isinstance(f, str) for f in fields)
        ):
            return JSONResponse({"error": "expected {url, name?, token?}"}, 400)
        if self.add_board is None:
            return JSONResponse({"error": "this gateway does not add boards"}, 404)
        url, name, token = fields
        try:
            added = self.add_board(str(url), name, token)
        except GatewayError as exc:
            return JSONResponse({"error": str(exc)}, 400)
        except OSError as exc:  # boards.json: a full or read-only data dir
            return JSONResponse({"error": f"not saved: {exc}"}, 503, headers={"Retry-After": "60"})
        await self.registry.settle("add", self.registry.get(added["id"]), actor_of(request),
                                   added["url"])  # fmt: skip
        return JSONResponse({"added": added})

    async def _device_action(
        self, request: Request, verb: str, action: Callable[[Device], None], close: bool = False
    ) -> Response:
        """Do ``action`` to the device the body names; answer once it is saved (and audited)."""
        body = await _json_body(request)
        ref = body.get("device") if isinstance(body, dict) else None
        if not isinstance(ref, str):
            return JSONResponse({"error": "expected {device}: its name or id"}, 400)
        device = self.registry.find(ref)
        if device is None:
            return JSONResponse({"error": f"unknown device {ref!r}"}, 404)
        if verb == "approve" and device.record.state == PENDING and device.conflict:
            # Two clients checked in with this id: approving would bind the first, maybe not
            # the user's own board. Start over rather than guess.
            return JSONResponse({"error": f"two clients claim the id of {device.alias} "
                                 f"({device.conflict}): forget it, restart your device so it "
                                 "checks in again, then approve it"}, 409)  # fmt: skip
        session = device.session
        action(device)
        if close and session is not None:
            await session.aclose()  # if it comes back, the registry decides anew
        try:
            await self.registry.settle(verb, device, actor_of(request))
        except StorageUnavailable as exc:  # done in memory, not on disk: the user must know
            return JSONResponse({"error": str(exc)}, 503, headers={"Retry-After": "60"})
        done = {"approve": "approved", "reject": "rejected", "forget": "forgotten"}[verb]
        return JSONResponse({done: {"device": device.alias, "id": device.device_id}})

    async def health(self, request: Request) -> Response:
        """Alive; the device count only for a request that carries the host token."""
        body: dict[str, object] = {"status": "ok"}
        trouble = self.trouble() if self.trouble is not None else None
        if trouble is not None:  # cluster: cut from the broker (gateway/cluster)
            return JSONResponse({"status": "unavailable", "reason": trouble}, 503)
        user = request.scope.get("user")  # set by the bearer auth when a host token is configured
        if user is not None and user.is_authenticated:
            body["devices_online"] = self.registry.online_count
        return JSONResponse(body)


def build_host_app(
    config: Config,
    frontend: McpFrontend,
    registry: DeviceRegistry,
    router: CallRouter,
    enroll: Enroll | None = None,
    photos: PhotoStore | None = None,
    dashboard: Dashboard | None = None,
    metrics: GatewayMetrics | None = None,
    trouble: Callable[[], str | None] | None = None,
    add_board: AddBoard | None = None,
    forget_board: Callable[[str], None] | None = None,
) -> tuple[Starlette, StreamableHTTPSessionManager]:
    """The host listener's app, and the session manager its owner must run (``mgr.run()``).

    ``trouble`` says why ``/healthz`` must fail (None when all is well); ``add_board`` adds a
    board that serves MCP itself (gateway/device_side/boards).
    """
    manager = StreamableHTTPSessionManager(app=frontend.server, security_settings=_SDK_CHECKS_OFF)
    sse = SseServerTransport("/messages/", security_settings=_SDK_CHECKS_OFF)
    api = _Api(frontend, registry, router, enroll, photos)
    api.trouble, api.add_board, api.forget_board = trouble, add_board, forget_board
    limiter = configured_limiter(config, "enroll")  # [limits] enroll_per_minute, enroll_burst
    enroll_limited = rate_limited(api.enroll, limiter, "enroll requests")
    token = config.host_token

    def guard(app: ASGIApp) -> ASGIApp:
        return RequireAuthMiddleware(app, required_scopes=[]) if token else app

    routes = [
        Route("/mcp", endpoint=guard(StreamableHTTPASGIApp(manager))),
        Route("/sse", endpoint=guard(_SseEndpoint(frontend, sse)), methods=["GET"]),
        Mount("/messages/", app=guard(sse.handle_post_message)),
        Route("/api/devices", endpoint=guard(_Endpoint(api.devices)), methods=["GET"]),
        Route("/api/call", endpoint=guard(_Endpoint(api.call)), methods=["POST"]),
        *(
            Route(f"/api/devices/{name}", endpoint=guard(_Endpoint(handler)), methods=["POST"])
            for name, handler in (
                ("forget", api.forget),
                ("approve", api.approve),
                ("reject", api.reject),
                ("pair", api.pair),
                ("add", api.add),
            )  # fmt: skip
        ),
        Route("/api/enroll", endpoint=guard(_Endpoint(enroll_limited)), methods=["POST"]),
        Route("/healthz", endpoint=api.health, methods=["GET"]),
        *(photo_routes(registry, photos, guard) if photos is not None else ()),
    ]
    if metrics is not None:
        routes.append(Route("/metrics", guard(_Endpoint(metrics.endpoint)), methods=["GET"]))
    if dashboard is not None:  # the companion dashboard at / (gateway/dashboard)
        routes += dashboard.routes(guard, _Endpoint)
    hosts, origins = host_patterns(config)
    middleware = [Middleware(HostOriginGuard, hosts=hosts, origins=origins)]
    if token:
        backend: AuthenticationBackend = BearerAuthBackend(StaticTokenVerifier(token))
        if dashboard is not None:  # or a signed-in dashboard session (with CSRF to change things)
            backend = SessionAuthBackend(backend, dashboard.sessions)
        middleware.append(
            Middleware(AuthenticationMiddleware, backend=backend, on_error=_auth_refused)
        )
    return Starlette(routes=routes, middleware=middleware), manager


def _auth_refused(conn: HTTPConnection, exc: AuthenticationError) -> Response:
    return JSONResponse({"error": str(exc)}, 403)


async def _json_body(request: Request) -> Any:
    """The request's JSON body, or None when it is not JSON."""
    try:
        return json.loads(await request.body())
    except ValueError:
        return None


class _Endpoint:
    """A request/response view as a raw ASGI app, so that auth can wrap it like MCP routes.

    An instance, not a function: Starlette's ``Route`` treats a plain function as a view.
    """

    def __init__(self, handler: Callable[[Request], Awaitable[Response]]) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self.handler(Request(scope, receive))
        await response(scope, receive, send)
