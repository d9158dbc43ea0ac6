"""The host listener: MCP over streamable HTTP (``/mcp``) and legacy SSE, plus a small JSON API.

Every route but ``/healthz`` sits behind the Host/Origin check (DNS rebinding) and, when a host
token is set, behind bearer auth. The SDK's own transport checks are turned off in favour of
``HostOriginGuard``, which covers the JSON API as well as MCP. ``/healthz`` answers anyone, so it
says only that the gateway is alive; how many devices are online is for the host token's holder.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from mcp.server.auth.middleware.bearer_auth import RequireAuthMiddleware
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

from gateway.compat.mcp_sdk import discard_session, sessions_owned_by
from gateway.config import Config
from gateway.devices.calls import CallRouter
from gateway.devices.enrollment import Enrollment
from gateway.devices.photos import PhotoStore
from gateway.devices.registry import DeviceRegistry
from gateway.host_side.api import AddBoard, Enroll, HostApi
from gateway.host_side.dashboard import Dashboard
from gateway.host_side.dashboard.session import SessionAuthBackend
from gateway.host_side.front import HostFront, wrapped
from gateway.host_side.json_answers import JsonAnswers
from gateway.host_side.mcp_server import McpFrontend
from gateway.host_side.metrics import GatewayMetrics
from gateway.host_side.oauth import BearerTokens, ConnectedApps, OAuthSite
from gateway.host_side.photo_resources import photo_routes
from gateway.host_side.waiting_calls import WaitingCalls
from gateway.net.addresses import is_wildcard, url_host
from gateway.net.networks import networks
from gateway.net.rate_limit import configured_limiter, rate_limited
from gateway.net.throttled import ThrottledLog

__all__ = ["HostOriginGuard", "build_host_app", "host_patterns"]

_LOOPBACK_HOSTS = ("127.0.0.1:*", "localhost:*", "[::1]:*", "127.0.0.1", "localhost", "[::1]")
_LOOPBACK_ORIGINS = ("http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*")
_SDK_CHECKS_OFF = TransportSecuritySettings(enable_dns_rebinding_protection=False)
REFUSAL_LOG_INTERVAL = 60.0  # a refused Host or Origin is said at most once a minute (each)

logger = logging.getLogger(__name__)


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
    origins = [*_LOOPBACK_ORIGINS, *config.host_allowed_origins]
    remote = urlsplit(config.host_public_url or "")
    if remote.hostname:  # [host] remote_url: the name remote apps use, trusted without repeating
        name = url_host(remote.hostname)
        hosts += [name, f"{name}:*"]
        origins += [f"{remote.scheme}://{name}", f"{remote.scheme}://{name}:*"]
    return tuple(hosts), tuple(origins)


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
    """ASGI middleware: 421 for a Host, 403 for an Origin outside the allowed patterns.

    Each refusal is logged at a bounded rate with the setting that would allow it: through a
    tunnel, a refused Host is otherwise only "couldn't connect" in the remote app.
    """

    def __init__(self, app: ASGIApp, hosts: tuple[str, ...], origins: tuple[str, ...]) -> None:
        self.app, self.hosts, self.origins = app, hosts, origins
        self.log = ThrottledLog(logger, REFUSAL_LOG_INTERVAL)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check the request, then pass it on."""
        if scope["type"] == "http" and scope["path"] != "/healthz":
            host, origin = _host_and_origin(scope)
            if not _allowed(host, self.hosts):
                self.log.warning("host", "refused a request for Host %r (421): add it to "
                                 "[host] allowed_hosts (GATEWAY_HOST_ALLOWED_HOSTS), or set "
                                 "[host] remote_url if remote apps use it", host[:200])  # fmt: skip
                await PlainTextResponse("Invalid Host header", 421)(scope, receive, send)
                return
            # The dashboard's own requests carry its origin, which is the (checked) Host: a
            # browser on the LAN address of a wildcard bind is same-origin, not cross-site.
            same_origin = origin in (f"http://{host}", f"https://{host}")
            if origin and not same_origin and not _allowed(origin, self.origins):
                self.log.warning("origin", "refused a request from Origin %r (403): add it to "
                                 "[host] allowed_origins (GATEWAY_HOST_ALLOWED_ORIGINS)",
                                 origin[:200])  # fmt: skip
                await PlainTextResponse("Invalid Origin header", 403)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _SseEndpoint:
    """``GET /sse``: one legacy SSE MCP session per request (an ASGI app, not a view)."""

    def __init__(self, frontend: McpFrontend, transport: SseServerTransport) -> None:
        self.frontend, self.transport = frontend, transport

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = self.frontend.server
        async with self.transport.connect_sse(scope, receive, send) as (read, write):
            await server.run(read, write, server.create_initialization_options())


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
    oauth: OAuthSite | None = None,
    add_board: AddBoard | None = None,
    forget_board: Callable[[str], None] | None = None,
    enrollment: Enrollment | None = None,
) -> tuple[ASGIApp, StreamableHTTPSessionManager]:
    """The host listener's app, and the session manager its owner must run (``mgr.run()``).

    ``trouble`` says why ``/healthz`` must fail (None when all is well). With ``oauth`` the
    listener is also an OAuth authorization server, and apps' tokens open the MCP routes.
    ``add_board`` adds a board that serves MCP itself (gateway/device_side/boards).
    """
    # A session nobody uses (a host that quit without DELETE) ends after the idle timeout; an
    # open GET stream (a host listening for changes) keeps it.
    manager = StreamableHTTPSessionManager(
        app=frontend.server,
        security_settings=_SDK_CHECKS_OFF,
        session_idle_timeout=config.host_session_idle_timeout,
    )
    sse = SseServerTransport("/messages/", security_settings=_SDK_CHECKS_OFF)
    api = HostApi(
        frontend, registry.known, registry.admin, router, enroll, photos,
        trouble=trouble, add_board=add_board, forget_board=forget_board, enrollment=enrollment,
    )  # fmt: skip
    limiter = configured_limiter(config, "enroll")  # [limits] enroll_per_minute, enroll_burst
    enroll_limited = rate_limited(api.enroll, limiter, "enroll requests")
    token = config.host_token

    def guard(app: ASGIApp) -> ASGIApp:
        return RequireAuthMiddleware(app, required_scopes=[]) if token else app

    def mcp_guard(app: ASGIApp) -> ASGIApp:  # 401s that point at the OAuth metadata
        return oauth.require(app, tokenless=not token) if oauth is not None else guard(app)

    # A call that streams nothing before its result is answered as JSON (json_answers.py).
    mcp = mcp_guard(JsonAnswers(StreamableHTTPASGIApp(manager)))
    routes = [
        Route("/mcp", endpoint=mcp),
        Route("/sse", endpoint=mcp_guard(_SseEndpoint(frontend, sse)), methods=["GET"]),
        Mount("/messages/", app=mcp_guard(sse.handle_post_message)),
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
        Route("/api/enrollments", endpoint=guard(_Endpoint(api.enrollments)), methods=["GET"]),
        Route(
            "/api/enrollments/revoke",
            endpoint=guard(_Endpoint(api.revoke_enrollment)),
            methods=["POST"],
        ),  # fmt: skip
        Route("/healthz", endpoint=api.health, methods=["GET"]),
        *(photo_routes(registry.known, photos, guard) if photos is not None else ()),
    ]
    if metrics is not None:
        routes.append(Route("/metrics", guard(_Endpoint(metrics.endpoint)), methods=["GET"]))
    if dashboard is not None:  # the companion dashboard at / (gateway/dashboard)
        routes += dashboard.routes(guard, _Endpoint)
    sessions = dashboard.sessions if dashboard is not None else None
    routes += WaitingCalls(router.confirmations, registry.known, sessions).routes(guard, _Endpoint)
    if oauth is not None:
        routes += [*oauth.routes(), *ConnectedApps(oauth).routes(guard, _Endpoint)]
        oauth.provider.subscribe_revoked(_SessionEnder(manager))
        oauth.provider.subscribe_devices(_Relist(frontend))
    hosts, origins = host_patterns(config)
    middleware = [Middleware(HostOriginGuard, hosts=hosts, origins=origins)]
    if token or oauth is not None:
        backend: AuthenticationBackend = BearerTokens(
            token, oauth.verify if oauth else None, config.host_tokens
        )
        if (
            dashboard is not None and token
        ):  # or a signed-in dashboard session (with CSRF to change things)
            ingress = networks(config.host_ingress_peers)  # Home Assistant's ingress proxy
            backend = SessionAuthBackend(backend, dashboard.sessions, ingress)
        middleware.append(
            Middleware(AuthenticationMiddleware, backend=backend, on_error=_auth_refused)
        )
    app = Starlette(routes=routes, middleware=middleware)
    # Every tool call is a POST to /mcp: it skips Starlette's layers, never the guards.
    return HostFront(app, {"/mcp": wrapped(mcp, middleware)}), manager


def _auth_refused(conn: HTTPConnection, exc: AuthenticationError) -> Response:
    return JSONResponse({"error": str(exc)}, 403)


class _SessionEnder:
    """Revoking an app ends its streamable-HTTP sessions too, not only its open requests.

    The SDK's manager records who opened each session, and ends one as it does itself
    (``gateway.compat.mcp_sdk``: private in the SDK): forgotten at once (404 from then on), its
    transport terminated.
    """

    def __init__(self, manager: StreamableHTTPSessionManager) -> None:
        self.manager = manager
        self._ending: set[asyncio.Task[None]] = set()

    def __call__(self, client_id: str) -> None:
        manager = self.manager
        for session_id, transport in sessions_owned_by(manager, client_id):
            task = asyncio.get_running_loop().create_task(
                discard_session(manager, session_id, transport), name="end-app-session"
            )
            self._ending.add(task)
            task.add_done_callback(self._ending.discard)


class _Relist:
    """An app whose devices the owner changed is told its tool list changed (every session is:
    a change of one scope costs what a device joining does, and names nobody)."""

    def __init__(self, frontend: McpFrontend) -> None:
        self.frontend = frontend
        self._telling: set[asyncio.Task[None]] = set()

    def __call__(self, client_id: str) -> None:
        task = asyncio.get_running_loop().create_task(
            self.frontend.notifier.tools_changed(), name="tell-app-devices-changed"
        )
        self._telling.add(task)
        task.add_done_callback(self._telling.discard)


class _Endpoint:
    """A request/response view as a raw ASGI app, so that auth can wrap it like MCP routes.

    An instance, not a function: Starlette's ``Route`` treats a plain function as a view.
    """

    def __init__(self, handler: Callable[[Request], Awaitable[Response]]) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self.handler(Request(scope, receive))
        await response(scope, receive, send)
