"""Dashboard sign-in: the host token exchanged for a session cookie, and CSRF protection.

With a host token set, a browser signs in once (``POST /login`` with the token) and gets an
HttpOnly, SameSite=Strict cookie naming a session held in memory (a restart signs everyone
out). A request with that cookie is authenticated for the dashboard's paths only, never for
MCP; one that changes anything must also carry the session's CSRF token in ``X-CSRF-Token``
(the page reads it from ``GET /api/session``), so a cookie that a browser attaches on its own
is never enough. A bearer token (the CLI, scripts) needs no cookie and no CSRF token.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from starlette.authentication import (
    AuthCredentials,
    AuthenticationBackend,
    AuthenticationError,
    BaseUser,
)
from starlette.requests import HTTPConnection, cookie_parser

from gateway.devices.audit import CLI_AGENT, Actor
from gateway.net.networks import Network, in_networks
from gateway.net.peer import socket_peer

__all__ = ["COOKIE", "CSRF_HEADER", "Session", "SessionAuthBackend", "Sessions",
           "actor_of"]  # fmt: skip

COOKIE = "gateway_session"
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Where a session cookie counts: the dashboard and its JSON API, never MCP (/mcp, /sse, ...).
COOKIE_PATHS = ("/api/", "/metrics")
LIFETIME = 12 * 3600.0  # seconds a session lasts after its last use
MAX_SESSIONS = 256  # the oldest goes first: sign-ins cannot grow memory without bound


@dataclass(slots=True)
class Session:
    """One signed-in browser."""

    id: str
    csrf: str
    expires: float


class Sessions:
    """The live sessions, checked against the host token at sign-in."""

    def __init__(self, token: str | None, clock: Callable[[], float] = time.monotonic) -> None:
        self._token = token.encode() if token else None
        self._clock = clock
        self._live: OrderedDict[str, Session] = OrderedDict()

    @property
    def required(self) -> bool:
        """True when a browser must sign in (a host token is set)."""
        return self._token is not None

    def login(self, presented: str) -> Session | None:
        """A new session for the right host token, else None."""
        given = presented.encode("utf-8", "surrogatepass")  # any text, even a lone surrogate
        if self._token is None or not hmac.compare_digest(given, self._token):
            return None
        session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), 0.0)
        self._live[session.id] = session
        while len(self._live) > MAX_SESSIONS:
            self._live.popitem(last=False)
        return self.get(session.id)

    def get(self, session_id: str | None) -> Session | None:
        """The live session called ``session_id``; using it extends its life."""
        session = self._live.get(session_id or "")
        if session is None:
            return None
        now = self._clock()
        if session.expires and session.expires < now:
            del self._live[session.id]
            return None
        session.expires = now + LIFETIME
        self._live.move_to_end(session.id)
        return session

    def logout(self, session_id: str | None) -> None:
        """End the session, if it exists."""
        self._live.pop(session_id or "", None)

    def from_cookie_header(self, value: bytes) -> Session | None:
        """The session named by a raw ``Cookie`` header."""
        return self.get(cookie_value(value.decode("latin-1")))

    def valid(self, value: bytes) -> bool:
        """True when a raw ``Cookie`` header names a live session (``ListenerLimits.session``)."""
        return self.from_cookie_header(value) is not None


def cookie_value(header: str) -> str | None:
    """Our session id in a ``Cookie`` header, if any.

    Parsed as Starlette parses it for the request: leniently, so that another app's odd cookie
    on the same host (cookies ignore ports) cannot hide ours from the connection guard.
    """
    return cookie_parser(header).get(COOKIE) or None


class SessionAuthBackend(AuthenticationBackend):
    """A bearer token, else a dashboard session cookie (with its CSRF token to change things)."""

    def __init__(
        self, bearer: AuthenticationBackend, sessions: Sessions, ingress: tuple[Network, ...] = ()
    ) -> None:
        self.bearer, self.sessions, self.ingress = bearer, sessions, ingress

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, BaseUser] | None:
        """Who sent ``conn``, or None (the routes' guard answers 401)."""
        found: Any = await self.bearer.authenticate(conn)
        if found is not None:
            return found  # type: ignore[no-any-return]
        if not conn.url.path.startswith(COOKIE_PATHS):
            return None
        if in_networks(socket_peer(conn), self.ingress):  # the socket's, not X-Forwarded-For
            # Home Assistant's ingress signed its user in already; only its proxy is trusted,
            # and a cross-site request is still refused by the Origin check.
            return AuthCredentials([]), _DASHBOARD
        session = self.sessions.get(conn.cookies.get(COOKIE))
        if session is None:
            return None
        if conn.scope.get("method") not in SAFE_METHODS:
            presented = conn.headers.get(CSRF_HEADER, "")
            if not hmac.compare_digest(presented.encode(), session.csrf.encode()):
                raise AuthenticationError("missing or wrong CSRF token: reload the dashboard")
        return AuthCredentials([]), _DASHBOARD


_DASHBOARD = AuthenticatedUser(AccessToken(token="", client_id="dashboard", scopes=[]))


def actor_of(connection: HTTPConnection) -> Actor:
    """Who made a call or a change through the JSON API, for the audit log, and from where.

    ``dashboard``: a signed-in session (its user is ``dashboard``) or, with no host token, a
    page of this gateway (a browser's request, with an Origin the guard let through). ``cli``:
    the CLI (its User-Agent). ``api``: anything else (scripts, with a bearer token or none).
    """
    headers = connection.headers
    user = connection.scope.get("user")
    if isinstance(user, AuthenticatedUser):
        browser = user.access_token.client_id == "dashboard"
    else:
        browser = bool(headers.get("origin"))
    if browser:
        who = "dashboard"
    elif headers.get("user-agent", "").startswith(CLI_AGENT):
        who = "cli"
    else:
        who = "api"
    return Actor(who, connection.client.host if connection.client else None)
